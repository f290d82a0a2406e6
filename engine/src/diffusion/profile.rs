//! `engine profile --diffusion`: `T_img` and `T_step` measured on the cpu
//! backend or a GPU (the cuda backend's runner), written as a diffusion
//! profile (the emulated backend and the
//! gateway's scheduler read the same format). Sizes, step counts and the
//! SP communication shares come from the template profile (the engine's
//! `--diffusion-profile`, or the bundled one): SP is not real on one host,
//! so `sp_comm` stays the template's.

use std::fmt::Write as _;

use policies::diffusion::{DiffusionProfile, ImageSize, VideoSize};

use super::{advance, latent_frames, model_res, noise, scale};
use crate::backend::BackendKind;
use crate::gpu::video::VideoRunner;
use crate::video::model::{Resolution, StreamState, VideoModel, CHANNELS};
use crate::video::png;

fn median_ms(repeats: u32, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..repeats.max(1))
        .map(|_| {
            let t = crate::clock::now();
            f();
            crate::clock::since(t).as_secs_f64() * 1000.0
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Measures every size of `template` on `gpu`, or on the host without
/// one; returns the TOML text, or the device's first error.
pub fn measure(
    template: &DiffusionProfile,
    model_seed: u64,
    repeats: u32,
    machine: &str,
    gpu: Option<&dyn VideoRunner>,
) -> Result<String, super::DiffusionError> {
    let model = super::model(model_seed);
    let backend = if gpu.is_some() { "cuda" } else { "cpu" };
    let mut out = format!(
        "# Measured by `engine profile --diffusion --backend {backend}` on {machine}.\n\
         model = \"{}\"\nengine_class = \"{backend}\"\nsource = \"engine profile --diffusion (sp_comm from the template: SP is emulated)\"\n\
         image_steps = {}\nvideo_steps = {}\nvideo_fps = {}\nref_frames = 81\nmax_seconds = {}\nmax_batch = {}\n",
        template.model, template.image_steps, template.video_steps, template.video_fps, template.max_seconds, template.max_batch
    );
    let states = vec![StreamState::new("profile"); 4];
    // The first device error, reported once every measurement returned.
    let failed = std::cell::RefCell::new(None);
    let step = |xs: &mut [Vec<f32>], res| {
        if let Err(e) = advance(gpu, &model, res, xs, &states[..xs.len()], 0, 1, 28) {
            failed.borrow_mut().get_or_insert(e);
        }
    };
    let _ = writeln!(out, "migrate_ms = {:.4}", migrate_ms(template, repeats));
    for i in &template.images {
        out.push_str(&image_section(i, &model, repeats, &step));
    }
    for v in &template.videos {
        out.push_str(&video_section(v, template.video_fps, &model, repeats, &step));
    }
    match failed.into_inner() {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// One step of each latent at a resolution (on the GPU or the host).
type Step<'a> = dyn Fn(&mut [Vec<f32>], Resolution) + 'a;

/// Moving a paused state of the largest video: serialised and parsed (the
/// HTTP hop between engines is not included).
fn migrate_ms(template: &DiffusionProfile, repeats: u32) -> f64 {
    let cpu = BackendKind::Cpu;
    let big = template.videos.last().map_or("720x1280", |v| v.size.as_str());
    let res = model_res(cpu, big);
    let latent =
        noise(2, "profile", latent_frames(cpu, 81) * res.latent_side() * res.latent_side() * CHANNELS);
    median_ms(repeats, || {
        let bytes: Vec<u8> = latent.iter().flat_map(|v| v.to_le_bytes()).collect();
        let back: Vec<f32> =
            bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        std::hint::black_box(back);
    })
}

/// `T_img`: one step of one image and of a batch of four (the slope), and
/// the VAE decode with PNG encoding.
fn image_section(i: &ImageSize, model: &VideoModel, repeats: u32, step: &Step<'_>) -> String {
    let res = model_res(BackendKind::Cpu, &i.size);
    let side = res.latent_side();
    let (w, h) = policies::diffusion::parse_size(&i.size).unwrap_or((64, 64));
    let mut xs: Vec<Vec<f32>> = (0..4).map(|k| noise(k, "profile", side * side * CHANNELS)).collect();
    let one = median_ms(repeats, || step(&mut xs[..1], res));
    let four = median_ms(repeats, || step(&mut xs, res));
    let vae = median_ms(repeats, || {
        let frame = model.decode(&xs[0], res).swap_remove(0);
        std::hint::black_box(png::encode_rgb(w, h, &scale(&frame, res.pixels(), w, h)));
    });
    let slope = ((four / one.max(1e-6)) - 1.0) / 3.0;
    format!(
        "\n[[image]]\nsize = \"{}\"\nstep_ms = {one:.4}\nbatch_slope = {:.3}\nvae_ms = {vae:.3}\n",
        i.size,
        slope.max(0.0)
    )
}

/// `T_step` of a whole video (81 frames) and its decode to an animated PNG.
fn video_section(v: &VideoSize, fps: u32, model: &VideoModel, repeats: u32, step: &Step<'_>) -> String {
    let cpu = BackendKind::Cpu;
    let res = model_res(cpu, &v.size);
    let side = res.latent_side();
    let mut x = [noise(1, "profile", latent_frames(cpu, 81) * side * side * CHANNELS)];
    let one = median_ms(repeats, || step(&mut x, res));
    let fps = u16::try_from(fps).unwrap_or(16);
    let vae = median_ms(repeats, || {
        let frames = model.decode(&x[0], res);
        let px = res.pixels() as u32;
        std::hint::black_box(png::encode_apng(px, px, &frames, fps));
    });
    format!(
        "\n[[video]]\nsize = \"{}\"\nstep_ms = {one:.4}\nsp_comm = {}\nvae_ms = {vae:.3}\n",
        v.size, v.sp_comm
    )
}
