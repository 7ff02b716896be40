//! The JSON shapes of the API, and only here: domain values rendered for the wire, and the
//! request bodies parsed from it.
//!
//! Every reply body is one of these structs, so the OpenAPI document (`GET /v1/openapi.json`) is
//! derived from the very types the handlers serialise; every request body is parsed into one of
//! these structs (serde, unknown fields refused), the same type the document describes, so the
//! document and the parser cannot drift.

pub mod batches;
pub mod chat;
pub mod input_items;
pub mod native;
pub mod openai;
pub mod requests;
pub mod service;
pub mod tools;
pub mod tools_in;
pub mod webhooks;

use lmsp_domain::Timestamp;

/// A single-valued string, e.g. the `object` field of every API object; its schema is that one
/// value.
macro_rules! constant {
    ($(#[$meta:meta])* $name:ident = $value:tt) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
        pub enum $name {
            /// The one value.
            #[default]
            #[serde(rename = $value)]
            Value,
        }

        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                crate::openapi::constant($value).into()
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}
pub(crate) use constant;

/// A page of a list: `{"object": "list", "data": [...], "has_more": bool}`, one type per item.
/// `with ids`: a list that names its ends, as OpenAI's lists of ids do, `{"object": "list",
/// "data": [...], "first_id", "last_id", "has_more"}`, each item a [`Listed`].
macro_rules! list_of {
    // `$data` names the items in `$init`: one name, passed from the arm that wrote both.
    (@list $(#[$meta:meta])* $name:ident of $item:ty, $data:ident
        { $($fields:tt)* } { $($init:tt)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
        pub struct $name {
            // Always `list`.
            #[schema(inline)]
            pub object: crate::wire::ListTag,
            /// The items.
            pub data: Vec<$item>,
            $($fields)*
            /// Whether more items follow this page.
            pub has_more: bool,
        }

        impl $name {
            /// A page of these items.
            pub fn new($data: Vec<$item>, has_more: bool) -> Self {
                Self {
                    object: crate::wire::ListTag::Value,
                    $($init)*
                    data: $data,
                    has_more,
                }
            }
        }
    };
    ($(#[$meta:meta])* $name:ident of $item:ty) => {
        crate::wire::list_of!(@list $(#[$meta])* $name of $item, data {} {});
    };
    ($(#[$meta:meta])* $name:ident of $item:ty, with ids) => {
        crate::wire::list_of!(@list $(#[$meta])* $name of $item, data {
            /// The first item's id (`null` when there is none).
            pub first_id: Option<String>,
            /// The last item's id: the `after` of the next page.
            pub last_id: Option<String>,
        } {
            first_id: data.first().map(|item| crate::wire::Listed::list_id(item).to_owned()),
            last_id: data.last().map(|item| crate::wire::Listed::list_id(item).to_owned()),
        });
    };
}
pub(crate) use list_of;

/// An item of a list that names its first and last items (`list_of!(… with ids)`).
pub trait Listed {
    /// The id it is named by.
    fn list_id(&self) -> &str;
}

constant!(
    /// `"list"`.
    ListTag = "list"
);

/// RFC 3339 with milliseconds, as every LMSP-native object shows times.
pub fn time(at: Timestamp) -> String {
    at.to_rfc3339()
}

/// A request's `seed`: any int64, as OpenAI takes it, or an integer up to 2^64 − 1 (the seeds
/// earlier releases drew, echoed back). The engine's seed is the `u64` of the same 64 bits (two's
/// complement), and [`shown_seed`] shows it as the int64 of those bits: a seed the client sent as
/// an int64 is echoed exactly as it was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seed(pub u64);

impl<'de> serde::Deserialize<'de> for Seed {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bits;

        impl serde::de::Visitor<'_> for Bits {
            type Value = Seed;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an integer from -2^63 to 2^64 - 1")
            }

            fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<Seed, E> {
                Ok(Seed(value))
            }

            fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<Seed, E> {
                Ok(Seed(value.cast_unsigned()))
            }
        }

        deserializer.deserialize_any(Bits)
    }
}

/// A task's seed as the wire shows it: the int64 of its 64 bits (see [`Seed`]).
pub fn shown_seed(seed: u64) -> i64 {
    seed.cast_signed()
}
