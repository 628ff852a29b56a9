//! The client's decoder of binary output messages (`protocol.md` §5.1): arbitrary bytes never
//! panic, and whatever it accepts is exactly what the server's encoder writes for those values
//! (so nothing malformed slips through as a valid delta).
#![no_main]
use bytes::Bytes;
use execrelay::rpc::binary_output::{
    decode_output_message, encode_output_message, is_binary_message,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = is_binary_message(data);
    if let Ok(d) = decode_output_message(Bytes::copy_from_slice(data)) {
        assert!(is_binary_message(data));
        assert!(!d.data.is_empty() && d.data.len() <= execrelay::config::MAX_CHUNK_BYTES);
        let again = encode_output_message(&d.process_id, d.seq, d.stream, &d.data);
        assert_eq!(
            again, data,
            "an accepted message re-encodes to the same bytes"
        );
    }
});
