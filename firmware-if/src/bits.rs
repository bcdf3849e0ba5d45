//! Bit fields inside little-endian hardware structures, and the `layout!` macro that
//! declares a structure once and derives its typed accessors, its field table (used to
//! generate `docs/register-map.md`) and its parse/emit helpers.
//!
//! Convention (as in the hns drivers): a structure is an array of little-endian 32-bit
//! words; a field `hi:lo` names bits counted from bit 0 of byte 0. A field here may span
//! at most 64 bits; it may cross a dword boundary (the hns sheet splits such fields into
//! `_L`/`_H` halves, we keep one field and say so in its doc).

/// One named bit field of a layout: its position and a one-line description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// Field name as used in docs and diagnostics (hns spelling where one exists).
    pub name: &'static str,
    /// Highest bit (inclusive), counted from bit 0 of byte 0.
    pub hi: u32,
    /// Lowest bit (inclusive).
    pub lo: u32,
    /// What the field means, with its unit.
    pub doc: &'static str,
}

impl Field {
    /// Width of the field in bits (1..=64).
    pub const fn width(&self) -> u32 {
        self.hi - self.lo + 1
    }

    /// The all-ones value of this field's width.
    pub const fn max_value(&self) -> u64 {
        if self.width() >= 64 {
            u64::MAX
        } else {
            (1u64 << self.width()) - 1
        }
    }

    /// Reads the field from `bytes`. Bits beyond the end of `bytes` read as zero, so a
    /// caller holding a fixed-size layout never hits that case.
    pub fn get(&self, bytes: &[u8]) -> u64 {
        // Gather the (at most 9) bytes that hold the field into a u128, then shift.
        let first = (self.lo / 8) as usize;
        let last = (self.hi / 8) as usize;
        let mut window = 0u128;
        for (i, index) in (first..=last).enumerate() {
            if let Some(b) = bytes.get(index) {
                window |= (*b as u128) << (8 * i);
            }
        }
        ((window >> (self.lo % 8)) as u64) & self.max_value()
    }

    /// Writes `value` into the field; bits of `value` above the field width are discarded,
    /// as a hardware register of that width would discard them. Bits beyond the end of
    /// `bytes` are not written.
    pub fn set(&self, bytes: &mut [u8], value: u64) {
        let first = (self.lo / 8) as usize;
        let last = (self.hi / 8) as usize;
        let shift = self.lo % 8;
        let mask = (self.max_value() as u128) << shift;
        let bits = ((value & self.max_value()) as u128) << shift;
        for (i, index) in (first..=last).enumerate() {
            if let Some(b) = bytes.get_mut(index) {
                let byte_mask = (mask >> (8 * i)) as u8;
                let byte_bits = (bits >> (8 * i)) as u8;
                *b = (*b & !byte_mask) | byte_bits;
            }
        }
    }
}

/// Why a byte slice could not be read as a layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The slice is shorter than the layout.
    #[error("{layout}: need {expected} bytes, got {actual}")]
    Truncated {
        /// Layout name.
        layout: &'static str,
        /// Size of the layout in bytes.
        expected: usize,
        /// Bytes available.
        actual: usize,
    },
}

/// A fixed-size hardware structure declared with [`layout!`](crate::layout).
pub trait Layout: Sized + Copy {
    /// Structure name.
    const NAME: &'static str;
    /// Size in bytes.
    const SIZE: usize;
    /// Every named field, in declaration order.
    const FIELDS: &'static [Field];
    /// The raw bytes.
    fn bytes(&self) -> &[u8];
    /// The raw bytes, mutable.
    fn bytes_mut(&mut self) -> &mut [u8];
    /// An all-zero structure.
    fn zeroed() -> Self;

    /// Reads the structure from the start of `bytes` (extra bytes are ignored).
    fn parse(bytes: &[u8]) -> Result<Self, LayoutError> {
        let mut value = Self::zeroed();
        let Some(source) = bytes.get(..Self::SIZE) else {
            return Err(LayoutError::Truncated {
                layout: Self::NAME,
                expected: Self::SIZE,
                actual: bytes.len(),
            });
        };
        value.bytes_mut().copy_from_slice(source);
        Ok(value)
    }

    /// Writes the structure to the start of `out`.
    fn emit(&self, out: &mut [u8]) -> Result<(), LayoutError> {
        let actual = out.len();
        let Some(target) = out.get_mut(..Self::SIZE) else {
            return Err(LayoutError::Truncated {
                layout: Self::NAME,
                expected: Self::SIZE,
                actual,
            });
        };
        target.copy_from_slice(self.bytes());
        Ok(())
    }

    /// Finds a field by name.
    fn field(name: &str) -> Option<&'static Field> {
        Self::FIELDS.iter().find(|f| f.name == name)
    }

    /// An all-ones structure: the starting point of a modify mask (hns rule: a mask bit
    /// of 1 keeps the device's current bit, 0 takes the bit from the new context).
    fn all_ones() -> Self {
        let mut value = Self::zeroed();
        value.bytes_mut().fill(0xFF);
        value
    }

    /// Clears the mask bits of `field` so a modify takes that field from the new context.
    fn open_field(&mut self, field: Field) {
        field.set(self.bytes_mut(), 0);
    }
}

/// Conversion between a field's raw `u64` and its accessor type.
pub trait FieldValue: Copy {
    /// From the raw field bits (already masked to the field width).
    fn from_raw(raw: u64) -> Self;
    /// To the raw field bits.
    fn to_raw(self) -> u64;
}

macro_rules! impl_field_value_int {
    ($($t:ty),*) => {$(
        impl FieldValue for $t {
            fn from_raw(raw: u64) -> Self { raw as $t }
            fn to_raw(self) -> u64 { self as u64 }
        }
    )*};
}
impl_field_value_int!(u8, u16, u32, u64);

impl FieldValue for bool {
    fn from_raw(raw: u64) -> Self {
        raw != 0
    }
    fn to_raw(self) -> u64 {
        self as u64
    }
}

/// Declares a fixed-size little-endian hardware structure with named bit fields.
///
/// ```
/// rnic_firmware_if::layout! {
///     /// An example.
///     pub struct Example[8] {
///         /// Low nibble.
///         NIBBLE / nibble / set_nibble: u8 = 3:0,
///         /// A flag.
///         FLAG / flag / set_flag: bool = 4:4,
///         /// The upper dword.
///         UPPER / upper / set_upper: u32 = 63:32,
///     }
/// }
/// use rnic_firmware_if::bits::Layout;
/// let mut e = Example::zeroed();
/// e.set_nibble(0xA);
/// e.set_flag(true);
/// e.set_upper(0x1234_5678);
/// assert_eq!(e.bytes(), &[0x1A, 0, 0, 0, 0x78, 0x56, 0x34, 0x12]);
/// ```
#[macro_export]
macro_rules! layout {
    (
        $(#[$meta:meta])*
        pub struct $name:ident [$size:expr] {
            $(
                $(#[doc = $fdoc:literal])+
                $const_name:ident / $getter:ident / $setter:ident : $ty:ty = $hi:literal : $lo:literal
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, $crate::zerocopy::FromBytes, $crate::zerocopy::IntoBytes,
                 $crate::zerocopy::KnownLayout, $crate::zerocopy::Immutable, $crate::zerocopy::Unaligned)]
        #[repr(C)]
        pub struct $name(pub [u8; $size]);

        impl $name {
            $(
                $(#[doc = $fdoc])+
                pub const $const_name: $crate::bits::Field = $crate::bits::Field {
                    name: stringify!($const_name),
                    hi: $hi,
                    lo: $lo,
                    doc: concat!($($fdoc),+),
                };

                $(#[doc = $fdoc])+
                pub fn $getter(&self) -> $ty {
                    <$ty as $crate::bits::FieldValue>::from_raw(Self::$const_name.get(&self.0))
                }

                #[doc = concat!("Sets `", stringify!($const_name), "` (bits above the field width are discarded).")]
                pub fn $setter(&mut self, value: $ty) {
                    Self::$const_name.set(&mut self.0, <$ty as $crate::bits::FieldValue>::to_raw(value));
                }
            )*
        }

        impl $crate::bits::Layout for $name {
            const NAME: &'static str = stringify!($name);
            const SIZE: usize = $size;
            const FIELDS: &'static [$crate::bits::Field] = &[$(Self::$const_name),*];
            fn bytes(&self) -> &[u8] { &self.0 }
            fn bytes_mut(&mut self) -> &mut [u8] { &mut self.0 }
            fn zeroed() -> Self { Self([0u8; $size]) }
        }

        impl Default for $name {
            fn default() -> Self { Self([0u8; $size]) }
        }

        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                let mut s = f.debug_struct(stringify!($name));
                $(
                    let v = Self::$const_name.get(&self.0);
                    if v != 0 { s.field(stringify!($const_name), &format_args!("{:#x}", v)); }
                )*
                s.finish_non_exhaustive()
            }
        }
    };
}

/// Checks that no two fields of a layout overlap and that every field lies inside it.
/// Returns the first problem found, for the layout tests.
pub fn check_fields(name: &str, size: usize, fields: &[Field]) -> Result<(), String> {
    let bits = size as u32 * 8;
    for f in fields {
        if f.lo > f.hi || f.width() > 64 || f.hi >= bits {
            return Err(format!("{name}.{}: bad range {}:{}", f.name, f.hi, f.lo));
        }
    }
    for (i, a) in fields.iter().enumerate() {
        for b in &fields[i + 1..] {
            if a.lo <= b.hi && b.lo <= a.hi {
                return Err(format!(
                    "{name}: {} {}:{} overlaps {} {}:{}",
                    a.name, a.hi, a.lo, b.name, b.hi, b.lo
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_get_and_set_cross_dword_boundaries() {
        let f = Field {
            name: "X",
            hi: 40,
            lo: 28,
            doc: "",
        };
        let mut bytes = [0u8; 8];
        f.set(&mut bytes, 0x1ABC);
        assert_eq!(f.get(&bytes), 0x1ABC);
        assert_eq!(u64::from_le_bytes(bytes), 0x1ABC << 28);
    }

    #[test]
    fn field_set_discards_bits_above_width() {
        let f = Field {
            name: "X",
            hi: 3,
            lo: 0,
            doc: "",
        };
        let mut bytes = [0xF0u8; 1];
        f.set(&mut bytes, 0x1F);
        assert_eq!(bytes, [0xFF]);
        f.set(&mut bytes, 0);
        assert_eq!(bytes, [0xF0]);
    }

    #[test]
    fn full_width_field_round_trips() {
        let f = Field {
            name: "X",
            hi: 127,
            lo: 64,
            doc: "",
        };
        let mut bytes = [0u8; 16];
        f.set(&mut bytes, u64::MAX - 5);
        assert_eq!(f.get(&bytes), u64::MAX - 5);
        assert_eq!(f.max_value(), u64::MAX);
    }

    #[test]
    fn check_fields_finds_overlap() {
        let a = Field {
            name: "A",
            hi: 7,
            lo: 0,
            doc: "",
        };
        let b = Field {
            name: "B",
            hi: 9,
            lo: 7,
            doc: "",
        };
        assert!(check_fields("T", 4, &[a, b]).is_err());
        assert!(check_fields("T", 1, &[b]).is_err());
        assert!(check_fields("T", 4, &[a]).is_ok());
    }
}
