//! Rebuild the crate when any file under `web/` changes, is added or removed: `rust-embed`
//! embeds the files it found at compile time, and a new file alone would not tell Cargo.
fn main() {
    println!("cargo:rerun-if-changed=web");
}
