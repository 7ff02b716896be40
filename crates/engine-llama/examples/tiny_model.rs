//! Writes the tests' tiny GGUF model (see `tests/tiny/mod.rs`) to a file, e.g. for a llama.cpp
//! server in other tests: `cargo run -p lmsp-engine-llama --example tiny_model -- OUT.gguf
//! [--chatml]` (`--chatml` adds a ChatML chat template).

#[path = "../tests/tiny/mod.rs"]
mod tiny;

fn main() -> Result<(), String> {
    let mut out = None;
    let mut template = None;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--chatml" => template = Some(tiny::CHATML),
            _ if out.is_none() => out = Some(arg),
            _ => return Err(format!("unexpected argument {arg}")),
        }
    }
    let out = out.ok_or("usage: tiny_model OUT.gguf [--chatml]")?;
    tiny::write(std::path::Path::new(&out), template);
    println!("{out}");
    Ok(())
}
