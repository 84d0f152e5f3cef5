// `sqlx::migrate!` embeds the migrations at compile time: a new or edited migration must
// rebuild the crate (`migrations` links to the workspace's top-level folder).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
