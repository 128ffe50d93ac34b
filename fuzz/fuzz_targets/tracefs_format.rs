//! tracefs `format` files: their layout changes across kernels (fields are
//! added, moved, renamed), and the offsets found here steer which bytes the
//! observer reads out of raw tracepoint records.
#![no_main]

use canaryscope_fuzz::tracefs::{field_offset, parse_format, Field};
use libfuzzer_sys::fuzz_target;
use std::fmt::Write;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let fields = parse_format(text);

    let field_lines = text.lines().filter(|l| l.contains("field:")).count();
    assert!(fields.len() <= field_lines, "{} fields from {field_lines} field lines", fields.len());

    for f in &fields {
        // A name is one C identifier-ish token: no separators survive.
        assert!(!f.name.is_empty(), "empty name");
        assert!(!f.name.contains(char::is_whitespace), "name {:?} has whitespace", f.name);
        assert!(!f.name.contains(['[', ';']), "name {:?} keeps a suffix or separator", f.name);
        assert!(text.contains(f.name.as_str()), "name {:?} is not in the input", f.name);
        // Lookups return the first field of that name, as the kernel lists
        // each name once and a duplicate must not shadow the real one.
        let first = fields.iter().find(|g| g.name == f.name).expect("f is in fields");
        assert_eq!(field_offset(&fields, &f.name), Some(first.offset));
    }
    assert_eq!(field_offset(&fields, ""), None, "the empty name never matches");

    // Rendering the fields back in the kernel's layout reads back the same
    // fields: nothing in a parsed name or number depends on the junk around it.
    let mut canonical = String::from("name: fuzz\nID: 1\nformat:\n");
    for Field { name, offset } in &fields {
        writeln!(canonical, "\tfield:unsigned long {name}[2];\toffset:{offset};\tsize:16;\tsigned:0;")
            .expect("writing to a String");
    }
    canonical.push_str("\nprint fmt: \"\"\n");
    assert_eq!(parse_format(&canonical), fields, "re-rendered fields differ:\n{canonical}");
});
