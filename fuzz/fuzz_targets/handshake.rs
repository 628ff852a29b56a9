//! Handshake message 1 (server side) and message 2 (client side): arbitrary bytes fail
//! cleanly.
#![no_main]
use execrelay::noise::handshake::{read_hello, ClientHandshake};
use execrelay::noise::keys::Keypair;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let server = Keypair::from_private([2; 32]);
    let _ = read_hello(&server, "", &[0; 16], data);
    let client = Keypair::from_private([1; 32]);
    if let Ok((hs, _)) = ClientHandshake::start(&client, &server.public, "", &[0; 16], None) {
        let _ = hs.finish(data);
    }
});
