//! GenServe's image + whole-video workloads (issue 24): the request mixes of
//! the paper (image-heavy, balanced, video-heavy; uniform or skewed
//! resolutions; 12-36 requests a minute; SLO scale σ), the virtual-time
//! pool that runs the production scheduler (`sim`), its experiments
//! (`bench`), and the live run against a gateway (`live`).

pub mod bench;
pub mod live;
pub mod sim;
pub mod workload;
