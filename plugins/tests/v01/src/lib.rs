//! `v01`: a plugin built against `disbatch:plugin@0.1.0`, from its own copy of that
//! version's WIT (`wit/plugin.wit` here, as it was released), not the repository's. It
//! reports progress 50% "halfway", prints its params and succeeds, so tests can show that
//! a host of 0.2.x still runs components built against 0.1.x.

wit_bindgen::generate!({
    path: "wit",
    world: "disbatch:plugin/plugin@0.1.0",
});

struct V01;

impl Guest for V01 {
    fn run(params: String) -> Result<u32, String> {
        disbatch::plugin::host::progress(Some(50.0), Some("halfway"));
        println!("v01 got {params}");
        Ok(1)
    }
}

export!(V01);
