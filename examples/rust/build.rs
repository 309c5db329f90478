// The rpath to libpstar's folder (found by pstar-sys), so that the example
// runs from a build tree without LD_LIBRARY_PATH.
fn main() {
    if let Ok(dir) = std::env::var("DEP_PSTAR_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
