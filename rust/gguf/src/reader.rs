//! A bounds-checked cursor over the file's bytes. Every length read from the file is
//! checked against what is left before anything is allocated for it.

use crate::strings::Strings;
use crate::value::{tag, Array, Value};

/// Why parsing stopped, without the file name (the caller adds it).
pub(crate) type ParseResult<T> = Result<T, String>;

/// Arrays may nest, but no real file nests deeper than 2; refuse silly depths
/// so a crafted file cannot blow the stack.
const MAX_ARRAY_DEPTH: usize = 8;

pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self { Reader { bytes, pos: 0 } }
    pub fn pos(&self) -> usize { self.pos }
    fn remaining(&self) -> usize { self.bytes.len() - self.pos }

    fn take(&mut self, n: usize, what: &str) -> ParseResult<&'a [u8]> {
        if n > self.remaining() {
            return Err(format!(
                "truncated: {what} needs {n} bytes at offset {} but the file has {} left",
                self.pos, self.remaining()
            ));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &str) -> ParseResult<[u8; N]> {
        Ok(self.take(N, what)?.try_into().expect("take returned N bytes"))
    }
    pub fn u32(&mut self, what: &str) -> ParseResult<u32> { Ok(u32::from_le_bytes(self.array(what)?)) }
    pub fn u64(&mut self, what: &str) -> ParseResult<u64> { Ok(u64::from_le_bytes(self.array(what)?)) }

    /// A count that sizes an allocation of elements at least `min_elem_bytes` long each:
    /// it cannot exceed what the rest of the file could hold.
    pub fn count(&mut self, what: &str, min_elem_bytes: usize) -> ParseResult<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let limit = (self.remaining() / min_elem_bytes.max(1)) as u64;
        if n > limit {
            return Err(format!("{what} at offset {at} is {n}, more than the rest of the file can hold"));
        }
        Ok(n as usize)
    }

    pub fn string(&mut self, what: &str) -> ParseResult<Vec<u8>> {
        let n = self.count(&format!("length of {what}"), 1)?;
        Ok(self.take(n, what)?.to_vec())
    }

    /// n strings into one buffer. Each length is checked against the rest of the file (as
    /// `count` does) before the bytes are taken; the messages are only built on error.
    fn strings(&mut self, n: usize, what: &str) -> ParseResult<Strings> {
        let mut out = Strings::with_capacity(n, 0);
        for i in 0..n {
            let at = self.pos;
            let len_what = || format!("length of string {i} of {what}");
            if self.remaining() < 8 {
                self.u64(&len_what())?; // the truncation error
            }
            let len = self.u64("")?;
            if len > self.remaining() as u64 {
                return Err(format!("{} at offset {at} is {len}, more than the rest of the file can hold", len_what()));
            }
            let bytes = self.take(len as usize, what)?;
            out.push(bytes);
        }
        Ok(out)
    }

    pub fn value(&mut self, type_id: u32, what: &str) -> ParseResult<Value> {
        self.value_at_depth(type_id, what, 0)
    }

    fn value_at_depth(&mut self, type_id: u32, what: &str, depth: usize) -> ParseResult<Value> {
        Ok(match type_id {
            tag::U8 => Value::U8(self.array::<1>(what)?[0]),
            tag::I8 => Value::I8(self.array::<1>(what)?[0] as i8),
            tag::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            tag::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            tag::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            tag::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            tag::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            tag::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            tag::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            tag::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            tag::BOOL => Value::Bool(self.bool(what)?),
            tag::STRING => Value::Str(self.string(what)?),
            tag::ARRAY => Value::Array(self.array_value(what, depth)?),
            other => return Err(format!("{what} has unknown value type {other}")),
        })
    }

    fn bool(&mut self, what: &str) -> ParseResult<bool> {
        match self.array::<1>(what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(format!("{what} is a bool with byte value {b}")),
        }
    }

    fn array_value(&mut self, what: &str, depth: usize) -> ParseResult<Array> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(format!("{what} nests arrays deeper than {MAX_ARRAY_DEPTH}"));
        }
        let elem = self.u32(&format!("element type of {what}"))?;
        let min_bytes = match elem {
            tag::U8 | tag::I8 | tag::BOOL => 1,
            tag::U16 | tag::I16 => 2,
            tag::U32 | tag::I32 | tag::F32 => 4,
            tag::U64 | tag::I64 | tag::F64 | tag::STRING => 8,
            tag::ARRAY => 12,
            other => return Err(format!("{what} is an array of unknown value type {other}")),
        };
        let n = self.count(&format!("length of {what}"), min_bytes)?;
        macro_rules! fixed {
            ($variant:ident, $t:ty, $size:expr) => {{
                let raw = self.take(n * $size, what)?;
                Array::$variant(raw.chunks_exact($size).map(|c| <$t>::from_le_bytes(c.try_into().unwrap())).collect())
            }};
        }
        Ok(match elem {
            tag::U8 => Array::U8(self.take(n, what)?.to_vec()),
            tag::I8 => Array::I8(self.take(n, what)?.iter().map(|&b| b as i8).collect()),
            tag::U16 => fixed!(U16, u16, 2),
            tag::I16 => fixed!(I16, i16, 2),
            tag::U32 => fixed!(U32, u32, 4),
            tag::I32 => fixed!(I32, i32, 4),
            tag::U64 => fixed!(U64, u64, 8),
            tag::I64 => fixed!(I64, i64, 8),
            tag::F32 => fixed!(F32, f32, 4),
            tag::F64 => fixed!(F64, f64, 8),
            tag::BOOL => Array::Bool((0..n).map(|_| self.bool(what)).collect::<ParseResult<_>>()?),
            tag::STRING => Array::Str(self.strings(n, what)?),
            tag::ARRAY => Array::Array(
                (0..n).map(|_| self.array_value(what, depth + 1)).collect::<ParseResult<_>>()?,
            ),
            _ => unreachable!("element type checked above"),
        })
    }
}
