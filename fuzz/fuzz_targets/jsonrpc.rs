//! JSON-RPC envelope classification and the line codec: arbitrary bytes never panic.
#![no_main]
use bytes::BytesMut;
use execrelay::rpc::jsonrpc::parse_inbound;
use execrelay::transport::line_codec::LineCodec;
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::Decoder;

fuzz_target!(|data: &[u8]| {
    let _ = parse_inbound(data);
    let mut codec = LineCodec::new(1024);
    let mut buf = BytesMut::from(data);
    while let Ok(Some(_)) = codec.decode(&mut buf) {}
});
