//! The answer to the CUDA runtime's integrity check (export table `d4082055`, slot 1), which the
//! client computes because every input lives in the client process: its pid and thread, the
//! addresses of its export tables, and the device identity it reports.
//!
//! The algorithm (docs/driver-interception.md, section 4) is HMAC (RFC 2104) over MD2
//! (RFC 1319) with a 16-byte key derived from a fixed table. MD2 is written here because no
//! maintained crate offers it (it is obsolete for every other purpose); it is ~40 lines and is
//! checked against the RFC's test vectors.
//!
//! Pure: no I/O, no state, no unsafe. The shim gathers the inputs and answers the call
//! (`crates/shim/src/dark_api/cudart.rs`).

#![forbid(unsafe_code)]

/// RFC 1319's substitution table.
const S: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199,
    115, 140, 152, 147, 43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66,
    111, 24, 138, 23, 229, 18, 190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47,
    238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127, 93,
    154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72, 165, 181, 209,
    215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226,
    156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, 27,
    96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81,
    175, 58, 195, 92, 249, 206, 186, 197, 234, 38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205,
    244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242, 239, 183, 14,
    102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237, 31, 26,
    219, 153, 141, 51, 159, 17, 131, 20,
];

/// MD2 digest of `msg`.
pub fn md2(msg: &[u8]) -> [u8; 16] {
    let pad = 16 - msg.len() % 16;
    let mut data = msg.to_vec();
    data.extend(std::iter::repeat_n(pad as u8, pad));
    let mut checksum = [0u8; 16];
    let mut l = 0u8;
    for block in data.chunks(16) {
        for j in 0..16 {
            checksum[j] ^= S[(block[j] ^ l) as usize];
            l = checksum[j];
        }
    }
    data.extend_from_slice(&checksum);
    let mut x = [0u8; 48];
    for block in data.chunks(16) {
        for j in 0..16 {
            x[16 + j] = block[j];
            x[32 + j] = x[16 + j] ^ x[j];
        }
        let mut t = 0u8;
        for round in 0..18u8 {
            for k in x.iter_mut() {
                *k ^= S[t as usize];
                t = *k;
            }
            t = t.wrapping_add(round);
        }
    }
    x[..16].try_into().expect("16 bytes")
}

/// HMAC-MD2 with a 16-byte key (MD2's block size is 16).
pub fn hmac_md2(key: &[u8; 16], msg: &[u8]) -> [u8; 16] {
    let mut inner: Vec<u8> = key.iter().map(|k| k ^ 0x36).collect();
    inner.extend_from_slice(msg);
    let mut outer: Vec<u8> = key.iter().map(|k| k ^ 0x5c).collect();
    outer.extend_from_slice(&md2(&inner));
    md2(&outer)
}

/// The fixed 64-byte table the key is walked out of, as four 16-byte rows.
const T: [[u8; 16]; 4] = [
    [
        0x6b, 0xcf, 0x32, 0x0f, 0xa4, 0x49, 0xd3, 0xa8, 0x33, 0xf8, 0xd0, 0x8e, 0x12, 0x4e, 0xa8,
        0x00,
    ],
    [
        0xeb, 0x94, 0x2c, 0x8f, 0x34, 0x49, 0xde, 0xf6, 0xbf, 0x29, 0x91, 0x20, 0xc7, 0x65, 0xf6,
        0xba,
    ],
    [
        0x78, 0x5c, 0x66, 0x27, 0xa7, 0xb2, 0x73, 0x92, 0xdb, 0x22, 0x1e, 0x20, 0x14, 0x6f, 0x87,
        0xff,
    ],
    [
        0xa5, 0xc3, 0x18, 0x01, 0x66, 0x64, 0xa5, 0x0e, 0x70, 0x51, 0x52, 0xa7, 0x80, 0x4b, 0xdf,
        0xef,
    ],
];

/// Derives the HMAC key by walking the table (16 steps from index 13 back to 13).
pub fn key() -> [u8; 16] {
    let mut k = [0u8; 16];
    let (mut i, mut t) = (13usize, 0x8bu8);
    loop {
        let v = T[1][i] ^ T[2][i] ^ T[3][i];
        let s = t ^ T[0][i] ^ T[1][i];
        k[(s >> 4) as usize] = v;
        t = !(v ^ t);
        i = (s & 0x0f) as usize;
        if i == 13 {
            return k;
        }
    }
}

/// A device as the client reports it.
#[derive(Clone, Copy, Debug)]
pub struct DeviceIdentity {
    pub uuid: [u8; 16],
    pub pci_domain: u32,
    pub pci_bus: u32,
    pub pci_device: u32,
}

/// Everything the check hashes.
#[derive(Clone, Copy, Debug)]
pub struct IntegrityInput<'a> {
    pub driver_version: u32,
    /// The call's first argument: the runtime version plus 0, 1 or 2.
    pub version: u32,
    pub pid: u32,
    /// Low 32 bits of `pthread_self()` (not `gettid()`).
    pub thread_id: u32,
    pub cudart_interface_table: u64,
    pub integrity_table: u64,
    pub integrity_fn: u64,
    pub unix_seconds: u64,
    pub devices: &'a [DeviceIdentity],
}

/// The message: 48 bytes, then 28 per device, little-endian, unpadded.
fn message(i: &IntegrityInput) -> Vec<u8> {
    let mut m = Vec::with_capacity(48 + 28 * i.devices.len());
    m.extend_from_slice(&i.driver_version.to_le_bytes());
    m.extend_from_slice(&i.version.to_le_bytes());
    m.extend_from_slice(&i.pid.to_le_bytes());
    m.extend_from_slice(&i.thread_id.to_le_bytes());
    m.extend_from_slice(&i.cudart_interface_table.to_le_bytes());
    m.extend_from_slice(&i.integrity_table.to_le_bytes());
    m.extend_from_slice(&i.integrity_fn.to_le_bytes());
    m.extend_from_slice(&i.unix_seconds.to_le_bytes());
    for d in i.devices {
        m.extend_from_slice(&d.uuid);
        m.extend_from_slice(&d.pci_domain.to_le_bytes());
        m.extend_from_slice(&d.pci_bus.to_le_bytes());
        m.extend_from_slice(&d.pci_device.to_le_bytes());
    }
    m
}

const FIXED: [u8; 16] = [
    0x5c, 0x67, 0xcb, 0x03, 0x1c, 0x18, 0x41, 0x33, 0xe8, 0xd1, 0x4c, 0x1f, 0xaa, 0x83, 0xd3, 0x8e,
];

/// The 16 bytes the check writes for `input`.
pub fn integrity_answer(input: &IntegrityInput) -> [u8; 16] {
    match input.version % 10 {
        0 => FIXED,
        1 => {
            let mut v = FIXED;
            v[7] = 0x18;
            v
        }
        _ => hmac_md2(&key(), &message(input)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn md2_matches_rfc_1319() {
        assert_eq!(hex(&md2(b"")), "8350e5a3e24c153df2275c9f80692773");
        assert_eq!(hex(&md2(b"abc")), "da853b0d3f88d99b30283a69e6ded6bb");
        assert_eq!(
            hex(&md2(b"message digest")),
            "ab4f496bfb2a530b219ff33031fe06b0"
        );
    }

    #[test]
    fn key_walk_yields_the_documented_key() {
        assert_eq!(hex(&key()), "146addae53a9a752aa0841360bf55a9f");
    }

    #[test]
    fn reproduces_the_published_test_vector() {
        let devices = [DeviceIdentity {
            uuid: [
                0x67, 0x22, 0xcb, 0xcf, 0xc6, 0x61, 0xf2, 0x92, 0x74, 0xd6, 0xed, 0x23, 0x2a, 0x32,
                0x13, 0x1c,
            ],
            pci_domain: 0,
            pci_bus: 4,
            pci_device: 0,
        }];
        let input = IntegrityInput {
            driver_version: 12020,
            version: 0x2B4A,
            pid: 0x4D08,
            thread_id: 0x2B78,
            cudart_interface_table: 0x0000_7FF8_C807_17F0,
            integrity_table: 0x0000_7FF8_C825_E4B0,
            integrity_fn: 0x0000_7FF8_C7DD_0AD0,
            unix_seconds: 0x64A3_65EE,
            devices: &devices,
        };
        assert_eq!(message(&input).len(), 76);
        assert_eq!(
            hex(&integrity_answer(&input)),
            "7a7014f22846c3a784cdbf423331f1ea"
        );
    }

    #[test]
    fn versions_ending_in_0_and_1_get_the_fixed_answers() {
        let mut i = IntegrityInput {
            driver_version: 13050,
            version: 13050,
            pid: 1,
            thread_id: 2,
            cudart_interface_table: 3,
            integrity_table: 4,
            integrity_fn: 5,
            unix_seconds: 6,
            devices: &[],
        };
        assert_eq!(
            hex(&integrity_answer(&i)),
            "5c67cb031c184133e8d14c1faa83d38e"
        );
        i.version = 13051;
        assert_eq!(
            hex(&integrity_answer(&i)),
            "5c67cb031c184118e8d14c1faa83d38e"
        );
    }
}
