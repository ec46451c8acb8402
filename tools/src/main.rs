mod bench;

fn main() {}
