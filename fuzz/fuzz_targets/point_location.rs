#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| geoshard::fuzzing::point_location(data));
