pub mod kafka;
