//! The sequential specifications histories are checked against.

pub mod kv;
pub mod register;
