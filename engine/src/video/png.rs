//! A minimal PNG (and animated PNG) encoder for the models' RGB frames:
//! 8-bit RGB, zlib "stored" (uncompressed) deflate blocks. Frames are small, so
//! compression would buy little; any PNG decoder reads these.

/// CRC-32 (ISO-HDLC) lookup table, built at compile time.
const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut n = 0;
    while n < 256 {
        let mut c = n as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0xEDB8_8320 } else { c >> 1 };
            k += 1;
        }
        t[n] = c;
        n += 1;
    }
    t
};

/// CRC-32 (ISO-HDLC), as PNG chunks need.
fn crc32(parts: &[&[u8]]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for part in parts {
        for &b in *part {
            crc = CRC_TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
        }
    }
    !crc
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for &x in chunk {
            a += u32::from(x);
            b += a;
        }
        a %= 65_521;
        b %= 65_521;
    }
    (b << 16) | a
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    out.extend_from_slice(&crc32(&[kind, data]).to_be_bytes());
}

/// Filtered rows (filter "none") in a zlib stream of stored blocks.
fn zlib_rows(width: u32, rgb: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(rgb.len() + rgb.len() / (width as usize * 3).max(1));
    for row in rgb.chunks(width as usize * 3) {
        raw.push(0); // filter: none
        raw.extend_from_slice(row);
    }
    let mut z = vec![0x78, 0x01]; // zlib header: deflate, 32 KiB window, no dictionary
    let blocks: Vec<&[u8]> = raw.chunks(65_535).collect();
    for (i, block) in blocks.iter().enumerate() {
        z.push(u8::from(i + 1 == blocks.len())); // BFINAL, BTYPE = stored
        let len = block.len() as u16;
        z.extend_from_slice(&len.to_le_bytes());
        z.extend_from_slice(&(!len).to_le_bytes());
        z.extend_from_slice(block);
    }
    z.extend_from_slice(&adler32(&raw).to_be_bytes());
    z
}

fn header(out: &mut Vec<u8>, width: u32, height: u32) {
    out.extend_from_slice(b"\x89PNG\r\n\x1a\n");
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit, truecolour, deflate, adaptive filters, no interlace
    chunk(out, b"IHDR", &ihdr);
}

/// `rgb` (`width × height × 3` bytes, row-major) as a PNG file.
pub fn encode_rgb(width: u32, height: u32, rgb: &[u8]) -> Vec<u8> {
    assert_eq!(rgb.len(), (width * height * 3) as usize, "RGB buffer size");
    let mut out = Vec::new();
    header(&mut out, width, height);
    chunk(&mut out, b"IDAT", &zlib_rows(width, rgb));
    chunk(&mut out, b"IEND", &[]);
    out
}

/// `frames` (each `width × height × 3` bytes) as an animated PNG (APNG)
/// playing once at `fps`; decoders without APNG show the first frame.
pub fn encode_apng(width: u32, height: u32, frames: &[Vec<u8>], fps: u16) -> Vec<u8> {
    assert!(!frames.is_empty(), "at least one frame");
    let mut out = Vec::new();
    header(&mut out, width, height);
    let mut actl = (frames.len() as u32).to_be_bytes().to_vec();
    actl.extend_from_slice(&1u32.to_be_bytes()); // plays once
    chunk(&mut out, b"acTL", &actl);
    let mut seq = 0u32;
    for (i, rgb) in frames.iter().enumerate() {
        assert_eq!(rgb.len(), (width * height * 3) as usize, "RGB buffer size");
        let mut fctl = seq.to_be_bytes().to_vec();
        for v in [width, height, 0, 0] {
            fctl.extend_from_slice(&v.to_be_bytes());
        }
        fctl.extend_from_slice(&1u16.to_be_bytes()); // delay: 1 / fps s
        fctl.extend_from_slice(&fps.max(1).to_be_bytes());
        fctl.extend_from_slice(&[0, 0]); // dispose none, blend source
        chunk(&mut out, b"fcTL", &fctl);
        seq += 1;
        let z = zlib_rows(width, rgb);
        if i == 0 {
            chunk(&mut out, b"IDAT", &z);
        } else {
            let mut fdat = seq.to_be_bytes().to_vec();
            fdat.extend_from_slice(&z);
            chunk(&mut out, b"fdAT", &fdat);
            seq += 1;
        }
    }
    chunk(&mut out, b"IEND", &[]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_match_known_values() {
        assert_eq!(crc32(&[b"IEND"]), 0xAE42_6082);
        assert_eq!(crc32(&[b"123456789"]), 0xCBF4_3926);
        assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
    }

    #[test]
    fn writes_a_well_formed_png() {
        let rgb: Vec<u8> = (0..4 * 2 * 3).map(|i| i as u8).collect();
        let png = encode_rgb(4, 2, &rgb);
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        assert!(png.ends_with(&[0, 0, 0, 0, b'I', b'E', b'N', b'D', 0xAE, 0x42, 0x60, 0x82]));
        // The stored block holds the filtered rows verbatim.
        let idat = png.windows(4).position(|w| w == b"IDAT").unwrap();
        let data = &png[idat + 4 + 2 + 5..];
        assert_eq!(&data[..13], &[0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
    }

    #[test]
    fn writes_an_animated_png_with_numbered_frames() {
        let frames: Vec<Vec<u8>> = (0..3u8).map(|f| vec![f; 2 * 2 * 3]).collect();
        let apng = encode_apng(2, 2, &frames, 16);
        let count = |tag: &[u8]| apng.windows(4).filter(|w| *w == tag).count();
        assert_eq!((count(b"acTL"), count(b"fcTL"), count(b"IDAT"), count(b"fdAT")), (1, 3, 1, 2));
        let actl = apng.windows(4).position(|w| w == b"acTL").unwrap();
        assert_eq!(&apng[actl + 4..actl + 8], &3u32.to_be_bytes(), "frame count");
        // Sequence numbers run 0..5 over fcTL and fdAT in order.
        let seqs: Vec<u32> = apng
            .windows(4)
            .enumerate()
            .filter(|(_, w)| *w == b"fcTL" || *w == b"fdAT")
            .map(|(i, _)| u32::from_be_bytes(apng[i + 4..i + 8].try_into().unwrap()))
            .collect();
        assert_eq!(seqs, vec![0, 1, 2, 3, 4]);
    }
}
