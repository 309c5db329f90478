// The rpath to libpstar's folder (found by pstar-sys) for this crate's tests
// and examples, so that they run from a build tree without LD_LIBRARY_PATH.
fn main() {
    if let Ok(dir) = std::env::var("DEP_PSTAR_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
