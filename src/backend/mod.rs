//! Forward-pass implementations of [`crate::engine::Backend`].

pub mod cuda;
