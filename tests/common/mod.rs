pub mod kafka;
pub mod temp;
