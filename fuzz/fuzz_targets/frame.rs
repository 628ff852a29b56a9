//! Frame decoder: any bytes decode or fail cleanly, and what decodes re-encodes identically.
#![no_main]
use execrelay_protocol::frame::Frame;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = Frame::decode(data) {
        let again = f.encode().expect("a decoded frame re-encodes");
        assert_eq!(again, data);
    }
});
