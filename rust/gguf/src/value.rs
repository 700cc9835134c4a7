//! Metadata values: the thirteen GGUF value types, arrays typed by their element type.

use crate::strings::Strings;

/// One metadata value. Strings are kept as bytes: GGUF does not promise valid UTF-8
/// (tokenizer vocabularies sometimes hold broken sequences).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8), I8(i8), U16(u16), I16(i16), U32(u32), I32(i32), U64(u64), I64(i64),
    F32(f32), F64(f64), Bool(bool), Str(Vec<u8>), Array(Array),
}

/// An array, stored by element type so that large vocabularies stay compact.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    U8(Vec<u8>), I8(Vec<i8>), U16(Vec<u16>), I16(Vec<i16>), U32(Vec<u32>), I32(Vec<i32>),
    U64(Vec<u64>), I64(Vec<i64>), F32(Vec<f32>), F64(Vec<f64>), Bool(Vec<bool>),
    Str(Strings), Array(Vec<Array>),
}

/// GGUF value type ids.
pub(crate) mod tag {
    pub const U8: u32 = 0; pub const I8: u32 = 1; pub const U16: u32 = 2; pub const I16: u32 = 3;
    pub const U32: u32 = 4; pub const I32: u32 = 5; pub const F32: u32 = 6; pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8; pub const ARRAY: u32 = 9; pub const U64: u32 = 10; pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

impl Value {
    /// The GGUF name of the value's type.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "UINT8", Value::I8(_) => "INT8", Value::U16(_) => "UINT16",
            Value::I16(_) => "INT16", Value::U32(_) => "UINT32", Value::I32(_) => "INT32",
            Value::U64(_) => "UINT64", Value::I64(_) => "INT64", Value::F32(_) => "FLOAT32",
            Value::F64(_) => "FLOAT64", Value::Bool(_) => "BOOL", Value::Str(_) => "STRING",
            Value::Array(_) => "ARRAY",
        }
    }
    /// Any integer type as i64 (u64 values above i64::MAX do not fit).
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            Value::U8(v) => v as i64, Value::I8(v) => v as i64, Value::U16(v) => v as i64,
            Value::I16(v) => v as i64, Value::U32(v) => v as i64, Value::I32(v) => v as i64,
            Value::U64(v) => i64::try_from(v).ok()?, Value::I64(v) => v,
            Value::Bool(v) => v as i64,
            _ => return None,
        })
    }
    pub fn as_u64(&self) -> Option<u64> { self.as_i64().and_then(|v| u64::try_from(v).ok()) }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self { Value::Bool(v) => Some(v), _ => None }
    }
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self { Value::Str(s) => Some(s), _ => None }
    }
    pub fn as_str(&self) -> Option<&str> { self.as_bytes().and_then(|b| std::str::from_utf8(b).ok()) }
    pub fn as_array(&self) -> Option<&Array> {
        match self { Value::Array(a) => Some(a), _ => None }
    }
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(), Array::I8(v) => v.len(), Array::U16(v) => v.len(),
            Array::I16(v) => v.len(), Array::U32(v) => v.len(), Array::I32(v) => v.len(),
            Array::U64(v) => v.len(), Array::I64(v) => v.len(), Array::F32(v) => v.len(),
            Array::F64(v) => v.len(), Array::Bool(v) => v.len(), Array::Str(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool { self.len() == 0 }
    /// The GGUF name of the element type.
    pub fn elem_type_name(&self) -> &'static str {
        match self {
            Array::U8(_) => "UINT8", Array::I8(_) => "INT8", Array::U16(_) => "UINT16",
            Array::I16(_) => "INT16", Array::U32(_) => "UINT32", Array::I32(_) => "INT32",
            Array::U64(_) => "UINT64", Array::I64(_) => "INT64", Array::F32(_) => "FLOAT32",
            Array::F64(_) => "FLOAT64", Array::Bool(_) => "BOOL", Array::Str(_) => "STRING",
            Array::Array(_) => "ARRAY",
        }
    }
    pub fn as_strs(&self) -> Option<&Strings> {
        match self { Array::Str(v) => Some(v), _ => None }
    }
    /// Numeric arrays widened to f32 (scores); None for strings and nested arrays.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        Some(match self {
            Array::F32(v) => v.clone(),
            Array::F64(v) => v.iter().map(|&x| x as f32).collect(),
            _ => self.to_i64_vec()?.into_iter().map(|x| x as f32).collect(),
        })
    }
    /// Integer arrays widened to i64 (token types, ids); None for other element types.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        Some(match self {
            Array::U8(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I8(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U16(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I16(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U32(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I32(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U64(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I64(v) => v.clone(),
            Array::Bool(v) => v.iter().map(|&x| x as i64).collect(),
            _ => return None,
        })
    }
}
