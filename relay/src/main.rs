//! `execrelay-relay`: the relay binary. Parses flags ([`execrelay_relay::server::cli`]) and
//! runs [`execrelay_relay::server::RelayServer`]; nothing else lives here.

fn main() {
    std::process::exit(execrelay_relay::server::cli::main());
}
