//! `wrongworld`: a valid component of another world — it exports `greet` instead of
//! `run` — so hosts can show how they refuse it.

wit_bindgen::generate!({
    inline: "
        package example:other@0.1.0;
        world other {
            export greet: func() -> string;
        }
    ",
});

struct Other;

impl Guest for Other {
    fn greet() -> String {
        "hello".into()
    }
}

export!(Other);
