//! HTTP/1.1 byte work: parsing request heads and chunked bodies, writing
//! responses. Pure: no sockets, no clock, no governor.

pub mod chunked;
pub mod request;
pub mod response;
