//! Forward-pass implementations of [`crate::engine::Backend`].
