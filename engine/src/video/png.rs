//! PNG and animated PNG (APNG) files of the models' 8-bit RGB frames, by the
//! `png` crate (fdeflate's fast deflate: compressed, and still cheaper
//! than the frames' compute).

use png::{BitDepth, ColorType, Compression, Encoder};

fn encoder(out: &mut Vec<u8>, width: u32, height: u32) -> Encoder<'_, &mut Vec<u8>> {
    let mut enc = Encoder::new(out, width, height);
    enc.set_color(ColorType::Rgb);
    enc.set_depth(BitDepth::Eight);
    enc.set_compression(Compression::Fast);
    enc
}

/// The encoder's errors here are only a buffer of the wrong size (checked
/// first) or a failed write (a `Vec` does not fail).
const WRITES: &str = "an RGB frame of the stated size encodes into a Vec";

/// `rgb` (`width × height × 3` bytes, row-major) as a PNG file.
pub fn encode_rgb(width: u32, height: u32, rgb: &[u8]) -> Vec<u8> {
    assert_eq!(rgb.len(), (width * height * 3) as usize, "RGB buffer size");
    let mut out = Vec::new();
    let mut w = encoder(&mut out, width, height).write_header().expect(WRITES);
    w.write_image_data(rgb).expect(WRITES);
    w.finish().expect(WRITES);
    out
}

/// `frames` (each `width × height × 3` bytes) as an animated PNG (APNG)
/// playing once at `fps`; decoders without APNG show the first frame.
pub fn encode_apng(width: u32, height: u32, frames: &[Vec<u8>], fps: u16) -> Vec<u8> {
    assert!(!frames.is_empty(), "at least one frame");
    let mut out = Vec::new();
    let mut enc = encoder(&mut out, width, height);
    enc.set_animated(frames.len() as u32, 1).expect(WRITES);
    enc.set_frame_delay(1, fps.max(1)).expect(WRITES);
    let mut w = enc.write_header().expect(WRITES);
    for rgb in frames {
        assert_eq!(rgb.len(), (width * height * 3) as usize, "RGB buffer size");
        w.write_image_data(rgb).expect(WRITES);
    }
    w.finish().expect(WRITES);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes every frame (one for a still PNG) and the APNG frame count.
    fn decode(file: &[u8]) -> (u32, u32, Option<u32>, Vec<Vec<u8>>) {
        let mut reader = png::Decoder::new(std::io::Cursor::new(file)).read_info().unwrap();
        let info = reader.info();
        let (w, h) = (info.width, info.height);
        let animated = info.animation_control.map(|a| a.num_frames);
        assert_eq!((info.color_type, info.bit_depth), (ColorType::Rgb, BitDepth::Eight));
        let mut frames = Vec::new();
        for _ in 0..animated.unwrap_or(1) {
            let mut buf = vec![0; reader.output_buffer_size().unwrap()];
            let out = reader.next_frame(&mut buf).unwrap();
            buf.truncate(out.buffer_size());
            frames.push(buf);
        }
        (w, h, animated, frames)
    }

    #[test]
    fn a_png_decodes_to_the_same_pixels() {
        let rgb: Vec<u8> = (0..16 * 9 * 3).map(|i| (i * 7 % 251) as u8).collect();
        let file = encode_rgb(16, 9, &rgb);
        assert_eq!(&file[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(decode(&file), (16, 9, None, vec![rgb]));
    }

    #[test]
    fn an_animated_png_holds_every_frame_at_its_rate() {
        let frames: Vec<Vec<u8>> = (0..3u8).map(|f| vec![f * 40; 4 * 4 * 3]).collect();
        let file = encode_apng(4, 4, &frames, 16);
        let mut reader = png::Decoder::new(std::io::Cursor::new(&file[..])).read_info().unwrap();
        let fctl = reader.info().frame_control.unwrap();
        assert_eq!((fctl.delay_num, fctl.delay_den), (1, 16), "1/16 s a frame");
        assert_eq!(reader.info().animation_control.unwrap().num_plays, 1, "plays once");
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        reader.next_frame(&mut buf).unwrap();
        assert_eq!(decode(&file), (4, 4, Some(3), frames));
    }

    #[test]
    #[should_panic(expected = "RGB buffer size")]
    fn a_short_buffer_is_a_bug_not_a_file() {
        encode_rgb(4, 4, &[0; 5]);
    }
}
