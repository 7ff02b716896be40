//! Tokens, pairing codes and new clients: the randomness lives here, the hashing in the domain.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use rand::rngs::OsRng;
use rand::{Rng, RngCore};

use lmsp_domain::auth::{Client, Scopes, Secret, TOKEN_PREFIX};
use lmsp_domain::{ClientId, Timestamp};

/// A new token: `lmsp_` and 32 random bytes in base64url.
pub fn generate_token() -> Secret {
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    Secret::new(format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes)))
}

/// A new pairing code such as `483-921`.
pub fn generate_pairing_code() -> Secret {
    let number: u32 = OsRng.gen_range(0..1_000_000);
    Secret::new(format!("{:03}-{:03}", number / 1000, number % 1000))
}

/// A new client with a fresh token; the token is returned to be shown once and never stored.
pub fn new_client(name: &str, scopes: Scopes, at: Timestamp) -> (Client, Secret) {
    let token = generate_token();
    let client = Client {
        id: ClientId::from_ulid(ulid::Ulid::new()),
        name: name.to_owned(),
        scopes,
        token_hash: token.hash(),
        created_at: at,
        revoked_at: None,
    };
    (client, token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmsp_domain::auth::{looks_like_pairing_code, looks_like_token};

    #[test]
    fn generated_tokens_and_codes_have_their_shapes() {
        assert!(looks_like_token(generate_token().expose()));
        assert!(looks_like_pairing_code(generate_pairing_code().expose()));
        assert_ne!(generate_token(), generate_token());
    }
}
