//! See the parent module [`crate::lifecycle`].
