//! A tiny llama-architecture GGUF model, written at test time (nothing is downloaded).
//!
//! The vocabulary is SentencePiece-style ("llama" tokenizer): `<unk>`, `<s>`, `</s>`, the 256
//! byte tokens `<0x00>`…`<0xFF>`, `▁` (a space) and the printable ASCII characters, so every
//! ASCII character is one token and anything else falls back to its UTF-8 bytes.
//!
//! The weights are random except for a built-in next-token map, so greedy output is known in
//! advance through the real llama.cpp code path: the embeddings of the tokens below are
//! orthogonal unit vectors (plus small noise), the output matrix maps each to its successor,
//! and the attention and feed-forward layers have small random weights that cannot outweigh
//! that. The map ([`next_text`] computes its output):
//!
//! - `0` → `1` → … → `9` → `!` → byte E2 → byte 82 → byte AC → `▁` (space) → `0`, so the
//!   output after a space is `0123456789!€ 0123…` (`€` is one character split over three tokens);
//! - `#` → `</s>` (end of generation);
//! - any other token → `0`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;

pub const N_EMBD: usize = 64;
pub const N_FF: usize = 128;
pub const N_HEAD: u32 = 4;
pub const N_LAYER: usize = 2;
pub const CONTEXT_LENGTH: u32 = 2048;

const UNK: usize = 0;
const BOS: usize = 1;
const EOS: usize = 2;

fn byte_token(byte: u8) -> usize {
    3 + usize::from(byte)
}

const SPACE: usize = 259;

fn char_token(c: u8) -> usize {
    assert!((0x21..=0x7E).contains(&c));
    260 + usize::from(c - 0x21)
}

const N_VOCAB: usize = 260 + 94;

fn vocabulary() -> Vec<(String, i32)> {
    let mut tokens = vec![
        ("<unk>".to_owned(), 2),
        ("<s>".to_owned(), 3),
        ("</s>".to_owned(), 3),
    ];
    for byte in 0..=255u8 {
        tokens.push((format!("<0x{byte:02X}>"), 6));
    }
    tokens.push(("\u{2581}".to_owned(), 1));
    for c in 0x21..=0x7Eu8 {
        tokens.push(((c as char).to_string(), 1));
    }
    assert_eq!(tokens.len(), N_VOCAB);
    tokens
}

/// The successor of each token of the map (token, its embedding dimension, successor).
fn map() -> Vec<(usize, usize)> {
    let digit = |d: u8| char_token(b'0' + d);
    let mut map = Vec::new();
    for d in 0..9 {
        map.push((digit(d), digit(d + 1)));
    }
    map.push((digit(9), char_token(b'!')));
    map.push((char_token(b'!'), byte_token(0xE2)));
    map.push((byte_token(0xE2), byte_token(0x82)));
    map.push((byte_token(0x82), byte_token(0xAC)));
    map.push((byte_token(0xAC), SPACE));
    map.push((SPACE, digit(0)));
    map.push((char_token(b'#'), EOS));
    map
}

/// The byte the greedy successor of the token of `byte` emits; `None` for the end.
fn successor(byte: u8) -> Option<u8> {
    Some(match byte {
        b'0'..=b'8' => byte + 1,
        b'9' => b'!',
        b'!' => 0xE2,
        0xE2 => 0x82,
        0x82 => 0xAC,
        0xAC => b' ',
        b' ' => b'0',
        b'#' => return None,
        _ => b'0',
    })
}

/// The greedy output, `tokens` tokens long at most, after a prompt whose last token is the
/// one of the byte `last`.
pub fn next_text(last: u8, tokens: usize) -> String {
    let mut bytes = Vec::new();
    let mut current = last;
    for _ in 0..tokens {
        let Some(next) = successor(current) else {
            break;
        };
        bytes.push(next);
        current = next;
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // Uniform in [-1, 1).
        ((z >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }

    fn fill(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.next() * scale).collect()
    }
}

enum Value {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
    Strings(Vec<String>),
    F32s(Vec<f32>),
    I32s(Vec<i32>),
}

fn put_str(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U32(v) => {
            out.extend_from_slice(&4u32.to_le_bytes());
            out.extend_from_slice(&v.to_le_bytes());
        }
        Value::F32(v) => {
            out.extend_from_slice(&6u32.to_le_bytes());
            out.extend_from_slice(&v.to_le_bytes());
        }
        Value::Bool(v) => {
            out.extend_from_slice(&7u32.to_le_bytes());
            out.push(u8::from(*v));
        }
        Value::Str(v) => {
            out.extend_from_slice(&8u32.to_le_bytes());
            put_str(out, v);
        }
        Value::Strings(vs) => {
            out.extend_from_slice(&9u32.to_le_bytes());
            out.extend_from_slice(&8u32.to_le_bytes());
            out.extend_from_slice(&(vs.len() as u64).to_le_bytes());
            for v in vs {
                put_str(out, v);
            }
        }
        Value::F32s(vs) => {
            out.extend_from_slice(&9u32.to_le_bytes());
            out.extend_from_slice(&6u32.to_le_bytes());
            out.extend_from_slice(&(vs.len() as u64).to_le_bytes());
            for v in vs {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        Value::I32s(vs) => {
            out.extend_from_slice(&9u32.to_le_bytes());
            out.extend_from_slice(&5u32.to_le_bytes());
            out.extend_from_slice(&(vs.len() as u64).to_le_bytes());
            for v in vs {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
}

const ALIGNMENT: usize = 32;

fn pad(out: &mut Vec<u8>) {
    out.resize(out.len().div_ceil(ALIGNMENT) * ALIGNMENT, 0);
}

/// A ChatML chat template (for a llama.cpp server's chat completions).
pub const CHATML: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}";

/// Writes the tiny model to `path`; with `chat_template`, the model carries that template.
pub fn write(path: &Path, chat_template: Option<&str>) {
    let vocabulary = vocabulary();
    let mut metadata: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::Str("llama".into())),
        ("general.name", Value::Str("lmsp-tiny".into())),
        ("general.alignment", Value::U32(ALIGNMENT as u32)),
        ("general.file_type", Value::U32(0)),
        ("llama.context_length", Value::U32(CONTEXT_LENGTH)),
        ("llama.embedding_length", Value::U32(N_EMBD as u32)),
        ("llama.block_count", Value::U32(N_LAYER as u32)),
        ("llama.feed_forward_length", Value::U32(N_FF as u32)),
        ("llama.attention.head_count", Value::U32(N_HEAD)),
        ("llama.attention.head_count_kv", Value::U32(N_HEAD)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        (
            "llama.rope.dimension_count",
            Value::U32(N_EMBD as u32 / N_HEAD),
        ),
        ("llama.vocab_size", Value::U32(N_VOCAB as u32)),
        ("tokenizer.ggml.model", Value::Str("llama".into())),
        (
            "tokenizer.ggml.tokens",
            Value::Strings(vocabulary.iter().map(|(t, _)| t.clone()).collect()),
        ),
        ("tokenizer.ggml.scores", Value::F32s(vec![0.0; N_VOCAB])),
        (
            "tokenizer.ggml.token_type",
            Value::I32s(vocabulary.iter().map(|(_, k)| *k).collect()),
        ),
        ("tokenizer.ggml.bos_token_id", Value::U32(BOS as u32)),
        ("tokenizer.ggml.eos_token_id", Value::U32(EOS as u32)),
        ("tokenizer.ggml.unknown_token_id", Value::U32(UNK as u32)),
        ("tokenizer.ggml.add_bos_token", Value::Bool(true)),
        ("tokenizer.ggml.add_eos_token", Value::Bool(false)),
        ("tokenizer.ggml.add_space_prefix", Value::Bool(false)),
    ];
    if let Some(template) = chat_template {
        metadata.push(("tokenizer.chat_template", Value::Str(template.into())));
    }

    let mut rng = Rng(0x5EED);
    // Embedding dimensions of the map's tokens; all others share OTHER.
    let map = map();
    const OTHER: usize = 16;
    let dimension_of =
        |token: usize| -> usize { map.iter().position(|&(t, _)| t == token).unwrap_or(OTHER) };
    let mut embeddings = rng.fill(N_EMBD * N_VOCAB, 0.02);
    for token in 0..N_VOCAB {
        let row = &mut embeddings[token * N_EMBD..(token + 1) * N_EMBD];
        for value in row.iter_mut().take(OTHER + 1) {
            *value = 0.0;
        }
        row[dimension_of(token)] = 1.0;
    }
    let mut output = rng.fill(N_EMBD * N_VOCAB, 0.01);
    for token in 0..N_VOCAB {
        let row = &mut output[token * N_EMBD..(token + 1) * N_EMBD];
        for value in row.iter_mut().take(OTHER + 1) {
            *value = 0.0;
        }
    }
    for &(token, next) in &map {
        output[next * N_EMBD + dimension_of(token)] = 1.0;
    }
    // Every other token → '0'.
    output[char_token(b'0') * N_EMBD + OTHER] = 1.0;

    let mut tensors: Vec<(String, Vec<u64>, Vec<f32>)> = vec![
        (
            "token_embd.weight".into(),
            vec![N_EMBD as u64, N_VOCAB as u64],
            embeddings,
        ),
        (
            "output_norm.weight".into(),
            vec![N_EMBD as u64],
            vec![1.0; N_EMBD],
        ),
        (
            "output.weight".into(),
            vec![N_EMBD as u64, N_VOCAB as u64],
            output,
        ),
    ];
    let square = [N_EMBD as u64, N_EMBD as u64];
    for layer in 0..N_LAYER {
        let name = |part: &str| format!("blk.{layer}.{part}.weight");
        tensors.push((name("attn_norm"), vec![N_EMBD as u64], vec![1.0; N_EMBD]));
        tensors.push((
            name("attn_q"),
            square.to_vec(),
            rng.fill(N_EMBD * N_EMBD, 0.1),
        ));
        tensors.push((
            name("attn_k"),
            square.to_vec(),
            rng.fill(N_EMBD * N_EMBD, 0.1),
        ));
        tensors.push((
            name("attn_v"),
            square.to_vec(),
            rng.fill(N_EMBD * N_EMBD, 0.1),
        ));
        tensors.push((
            name("attn_output"),
            square.to_vec(),
            rng.fill(N_EMBD * N_EMBD, 0.005),
        ));
        tensors.push((name("ffn_norm"), vec![N_EMBD as u64], vec![1.0; N_EMBD]));
        tensors.push((
            name("ffn_gate"),
            vec![N_EMBD as u64, N_FF as u64],
            rng.fill(N_EMBD * N_FF, 0.1),
        ));
        tensors.push((
            name("ffn_down"),
            vec![N_FF as u64, N_EMBD as u64],
            rng.fill(N_FF * N_EMBD, 0.005),
        ));
        tensors.push((
            name("ffn_up"),
            vec![N_EMBD as u64, N_FF as u64],
            rng.fill(N_EMBD * N_FF, 0.1),
        ));
    }

    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in &metadata {
        put_str(&mut out, key);
        put_value(&mut out, value);
    }
    let mut offset = 0u64;
    for (name, dims, data) in &tensors {
        assert_eq!(dims.iter().product::<u64>() as usize, data.len(), "{name}");
        put_str(&mut out, name);
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&0u32.to_le_bytes()); // F32
        out.extend_from_slice(&offset.to_le_bytes());
        let size = (data.len() * 4) as u64;
        offset += size.div_ceil(ALIGNMENT as u64) * ALIGNMENT as u64;
    }
    pad(&mut out);
    for (_, _, data) in &tensors {
        for v in data {
            out.extend_from_slice(&v.to_le_bytes());
        }
        pad(&mut out);
    }
    let mut file = std::fs::File::create(path).unwrap();
    file.write_all(&out).unwrap();
}
