//! NVIDIA GPU evidence (in progress).
