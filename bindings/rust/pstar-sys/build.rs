// Finds libpstar: PSTAR_LIB_DIR (a folder holding libpstar.so) if set, else
// the `pkg-config` program (pstar.pc), else the linker's default paths.  Adds
// an rpath to that folder for this crate's own tests, and passes the folder
// on as DEP_PSTAR_LIB_DIR (the `links` metadata) to the crates that depend on
// this one, whose build scripts add the rpath for their tests and examples.
use std::env;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PSTAR_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let mut dirs: Vec<String> = Vec::new();
    if let Ok(dir) = env::var("PSTAR_LIB_DIR") {
        if !dir.is_empty() {
            dirs.push(dir);
        }
    }
    if dirs.is_empty() {
        if let Ok(out) = Command::new("pkg-config").args(["--libs-only-L", "pstar"]).output() {
            if out.status.success() {
                for flag in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    if let Some(dir) = flag.strip_prefix("-L") {
                        dirs.push(dir.to_string());
                    }
                }
            }
        }
    }
    for dir in &dirs {
        println!("cargo:rustc-link-search=native={}", dir);
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
    if let Some(dir) = dirs.first() {
        println!("cargo:lib_dir={}", dir);
    }
    println!("cargo:rustc-link-lib=dylib=pstar");
}
