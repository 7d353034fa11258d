pub mod http;
pub mod kafka;
pub mod temp;
