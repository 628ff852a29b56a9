//! The server's decoder of binary writes (`protocol.md` §5.2): arbitrary bytes never panic,
//! and whatever it accepts is exactly what the client's encoder writes for those values (so
//! nothing malformed slips through as a valid write).
#![no_main]
use bytes::Bytes;
use execrelay::rpc::binary_output::is_binary_message;
use execrelay::rpc::binary_write::{decode_binary_write, encode_write_head, fits_binary_write};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(w) = decode_binary_write(Bytes::copy_from_slice(data)) {
        assert!(is_binary_message(data));
        let write_id = w.write_id.as_deref().unwrap_or("");
        assert!(fits_binary_write(w.id, &w.process_id, write_id, w.data.len()));
        let mut again = encode_write_head(w.id, w.close_stdin, &w.process_id, write_id).to_vec();
        again.extend_from_slice(&w.data);
        assert_eq!(again, data, "an accepted write re-encodes to the same bytes");
    }
});
