//! Prints one line per compiled-in backend: `NAME available` or `NAME unavailable: REASON`.

fn main() {
    for backend in compute_tests::backends::enabled() {
        match (backend.availability)() {
            Ok(()) => println!("{} available", backend.name),
            Err(reason) => println!(
                "{} unavailable: {}",
                backend.name,
                reason.replace('\n', " ")
            ),
        }
    }
}
