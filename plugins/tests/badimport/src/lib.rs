//! `badimport`: exports `run` like a plugin but imports an interface no Disbatch host
//! provides, so hosts can show how they refuse it.

wit_bindgen::generate!({
    inline: "
        package example:needy@0.1.0;
        interface missing {
            secret: func() -> string;
        }
        world needy {
            import missing;
            export run: func(params: string) -> result<u32, string>;
        }
    ",
});

struct Needy;

impl Guest for Needy {
    fn run(_params: String) -> Result<u32, String> {
        Ok(example::needy::missing::secret().len() as u32)
    }
}

export!(Needy);
