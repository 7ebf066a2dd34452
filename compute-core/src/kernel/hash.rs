//! The stable kernel hash: FNV-1a 128 over a canonical encoding of the serde data model.
//!
//! The encoding is produced by a serializer that writes each primitive as a tag byte and its
//! little-endian bytes, lengths as `u64`, enum variants by index and struct fields in declaration
//! order. It depends on neither the platform nor the process, unlike `std`'s `RandomState`.

use serde::Serialize;
use serde::ser;

/// Bumped whenever the IR's encoding changes meaning, so stale on-disk caches miss.
const ENCODING_VERSION: u8 = 1;

const FNV_OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
const FNV_PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

/// The stable hash of a [`KernelDefinition`](super::KernelDefinition), the key of compile caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelId(pub u128);

impl core::fmt::Display for KernelId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Hash any serialisable value with the canonical encoding.
pub(crate) fn stable_hash<T: Serialize>(value: &T) -> KernelId {
    let mut hasher = Fnv128(FNV_OFFSET);
    hasher.write(&[ENCODING_VERSION]);
    match value.serialize(&mut hasher) {
        Ok(()) => KernelId(hasher.0),
        // The serializer never fails and the IR's Serialize impls are derived.
        Err(e) => unreachable!("stable hash failed: {e}"),
    }
}

struct Fnv128(u128);

impl Fnv128 {
    fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        for &b in bytes {
            h ^= b as u128;
            h = h.wrapping_mul(FNV_PRIME);
        }
        self.0 = h;
    }

    fn tag(&mut self, tag: u8) {
        self.write(&[tag]);
    }

    fn len(&mut self, len: usize) {
        self.write(&(len as u64).to_le_bytes());
    }
}

/// The (never raised) error of the hashing serializer.
#[derive(Debug)]
pub(crate) struct HashError(String);

impl core::fmt::Display for HashError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HashError {}

impl ser::Error for HashError {
    fn custom<T: core::fmt::Display>(msg: T) -> Self {
        HashError(msg.to_string())
    }
}

macro_rules! prim {
    ($($method:ident($t:ty) = $tag:expr;)*) => {
        $(fn $method(self, v: $t) -> Result<(), HashError> {
            self.tag($tag);
            self.write(&v.to_le_bytes());
            Ok(())
        })*
    };
}

impl ser::Serializer for &mut Fnv128 {
    type Ok = ();
    type Error = HashError;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    prim! {
        serialize_i8(i8) = 1;
        serialize_i16(i16) = 2;
        serialize_i32(i32) = 3;
        serialize_i64(i64) = 4;
        serialize_i128(i128) = 5;
        serialize_u8(u8) = 6;
        serialize_u16(u16) = 7;
        serialize_u32(u32) = 8;
        serialize_u64(u64) = 9;
        serialize_u128(u128) = 10;
        serialize_f32(f32) = 11;
        serialize_f64(f64) = 12;
    }

    fn serialize_bool(self, v: bool) -> Result<(), HashError> {
        self.write(&[13, v as u8]);
        Ok(())
    }

    fn serialize_char(self, v: char) -> Result<(), HashError> {
        self.tag(14);
        self.write(&(v as u32).to_le_bytes());
        Ok(())
    }

    fn serialize_str(self, v: &str) -> Result<(), HashError> {
        self.tag(15);
        self.len(v.len());
        self.write(v.as_bytes());
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), HashError> {
        self.tag(16);
        self.len(v.len());
        self.write(v);
        Ok(())
    }

    fn serialize_none(self) -> Result<(), HashError> {
        self.tag(17);
        Ok(())
    }

    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<(), HashError> {
        self.tag(18);
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), HashError> {
        self.tag(19);
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), HashError> {
        self.tag(19);
        Ok(())
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
    ) -> Result<(), HashError> {
        self.tag(20);
        self.write(&index.to_le_bytes());
        Ok(())
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), HashError> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        value: &T,
    ) -> Result<(), HashError> {
        self.tag(21);
        self.write(&index.to_le_bytes());
        value.serialize(self)
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Self, HashError> {
        self.tag(22);
        // Derived impls and std collections always know their length.
        self.len(len.unwrap_or(usize::MAX));
        Ok(self)
    }

    fn serialize_tuple(self, len: usize) -> Result<Self, HashError> {
        self.tag(23);
        self.len(len);
        Ok(self)
    }

    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<Self, HashError> {
        self.serialize_tuple(len)
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        len: usize,
    ) -> Result<Self, HashError> {
        self.tag(24);
        self.write(&index.to_le_bytes());
        self.len(len);
        Ok(self)
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Self, HashError> {
        self.tag(25);
        self.len(len.unwrap_or(usize::MAX));
        Ok(self)
    }

    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<Self, HashError> {
        self.tag(26);
        self.len(len);
        Ok(self)
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        len: usize,
    ) -> Result<Self, HashError> {
        self.tag(27);
        self.write(&index.to_le_bytes());
        self.len(len);
        Ok(self)
    }
}

macro_rules! compound {
    ($($trait:ident :: $method:ident),*) => {
        $(impl<'a> ser::$trait for &'a mut Fnv128 {
            type Ok = ();
            type Error = HashError;
            fn $method<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), HashError> {
                value.serialize(&mut **self)
            }
            fn end(self) -> Result<(), HashError> {
                Ok(())
            }
        })*
    };
}

compound!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for &mut Fnv128 {
    type Ok = ();
    type Error = HashError;
    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result<(), HashError> {
        key.serialize(&mut **self)
    }
    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), HashError> {
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), HashError> {
        Ok(())
    }
}

impl ser::SerializeStruct for &mut Fnv128 {
    type Ok = ();
    type Error = HashError;
    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        _key: &'static str,
        value: &T,
    ) -> Result<(), HashError> {
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), HashError> {
        Ok(())
    }
}

impl ser::SerializeStructVariant for &mut Fnv128 {
    type Ok = ();
    type Error = HashError;
    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        _key: &'static str,
        value: &T,
    ) -> Result<(), HashError> {
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), HashError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv128_matches_reference_vectors() {
        let mut h = Fnv128(FNV_OFFSET);
        h.write(b"");
        assert_eq!(h.0, FNV_OFFSET);
        let mut h = Fnv128(FNV_OFFSET);
        h.write(b"a");
        assert_eq!(h.0, 0xd228cb696f1a8caf78912b704e4a8964);
    }
}
