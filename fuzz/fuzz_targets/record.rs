//! Record opener and message deframer: arbitrary ciphertexts and stream bytes never panic.
#![no_main]
use std::sync::OnceLock;

use execrelay::noise::handshake::{read_hello, ClientHandshake, TransportKeys};
use execrelay::noise::keys::Keypair;
use execrelay::noise::record::{MessageDeframer, RecordOpener};
use libfuzzer_sys::fuzz_target;

fn keys() -> &'static TransportKeys {
    static K: OnceLock<TransportKeys> = OnceLock::new();
    K.get_or_init(|| {
        let c = Keypair::from_private([1; 32]);
        let s = Keypair::from_private([2; 32]);
        let sid = [0u8; 16];
        let (hs, m1) = ClientHandshake::start(&c, &s.public, "", &sid, None).unwrap();
        let (m2, sk) = read_hello(&s, "", &sid, &m1).unwrap().accept("f").unwrap();
        let _ = hs.finish(&m2).unwrap();
        sk
    })
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let nonce = u64::from_be_bytes(data[..8].try_into().unwrap());
    let mut opener = RecordOpener::new(keys().clone(), 1 << 16);
    let _ = opener.open(nonce, &data[8..]);
    let mut d = MessageDeframer::new(1 << 16);
    for chunk in data.chunks(7) {
        if d.push(chunk).is_err() {
            break;
        }
    }
});
