#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| geoshard::fuzzing::template_path(data));
