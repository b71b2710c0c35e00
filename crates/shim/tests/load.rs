//! Loading the shim does nothing: no thread, no connection, until the first driver call.

use std::ffi::CString;
use std::os::unix::net::UnixListener;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn loading_starts_no_thread_and_opens_no_connection() {
    let dir = std::env::temp_dir().join(format!("gpufuse-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    listener.set_nonblocking(true).unwrap();
    std::env::set_var("GPUFUSE_SERVER", format!("unix:{}", sock.display()));

    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().parent().unwrap().join("libcuda.so");
    assert!(
        lib.exists(),
        "{} missing: build the shim first",
        lib.display()
    );
    let before = threads();
    let path = CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: dlopen with a valid NUL-terminated path; the handle is closed below.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen failed");
    let name = CString::new("cuGetProcAddress_v2").unwrap();
    // SAFETY: valid handle and symbol name.
    assert!(!unsafe { libc::dlsym(handle, name.as_ptr()) }.is_null());
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(threads(), before, "loading the shim started a thread");
    assert!(
        listener.accept().is_err(),
        "loading the shim connected to the server"
    );
    // SAFETY: the handle came from dlopen above.
    unsafe { libc::dlclose(handle) };
    let _ = std::fs::remove_dir_all(&dir);
}
