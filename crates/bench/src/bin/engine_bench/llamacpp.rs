//! llama.cpp's HTTP server (the pinned `xllamacpp` of `scripts/llamacpp-server-deps`, run by
//! `tests/llamacpp/serve.py`), killed when dropped.

use std::io::{BufRead, BufReader};
use std::num::NonZeroU32;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{anyhow, bail, Context};

pub struct LlamaCppServer {
    child: Child,
    /// The API root, `http://127.0.0.1:PORT/v1`.
    pub api: String,
}

impl LlamaCppServer {
    /// `parallel` slots of `context` tokens each, `threads` CPU threads for all of them.
    pub fn start(
        python: &Path,
        model: &Path,
        threads: NonZeroU32,
        context: u32,
        parallel: u32,
    ) -> anyhow::Result<Self> {
        let serve = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/llamacpp/serve.py");
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut child = Command::new(python)
            .arg(&serve)
            .arg(model)
            .arg(port.to_string())
            .args(["--threads", &threads.to_string()])
            .args(["--ctx", &context.to_string()])
            .args(["--parallel", &parallel.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| {
                format!(
                    "cannot run {} (install it with scripts/llamacpp-server-deps)",
                    python.display()
                )
            })?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let first = BufReader::new(stdout).lines().next().transpose()?;
        if !first
            .as_deref()
            .is_some_and(|l| l.starts_with("listening "))
        {
            let _ = child.kill();
            let _ = child.wait();
            bail!("llama.cpp's server did not start: {first:?}");
        }
        Ok(Self {
            child,
            api: format!("http://127.0.0.1:{port}/v1"),
        })
    }
}

impl Drop for LlamaCppServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
