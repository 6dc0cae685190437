//! builder
