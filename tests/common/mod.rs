pub mod http;
pub mod kafka;
pub mod own_broker;
pub mod process;
pub mod skip;
pub mod temp;
