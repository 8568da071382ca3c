//! What the server keeps on disk between runs (SPEC §11).
//!
//! Only the reactor's start-up and stop paths come here; nothing on the
//! request path reads or writes a file.

pub mod secret;
