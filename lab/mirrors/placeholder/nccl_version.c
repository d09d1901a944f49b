/*
 * Kimi lab placeholder for NVIDIA's libnccl.so.2.
 *
 * It is NOT NCCL: it cannot communicate. It exists so that the lab's facts modules can dlopen the library a
 * package or wheel installed and read its version the way they would on a GPU node (ncclGetVersion), which
 * makes version pinning and skew checks real on CPU-only machines. The build passes the version in:
 *   -DLAB_NCCL_VERSION_CODE=23007 -DLAB_NCCL_VERSION_STRING="2.30.7"
 */
#ifndef LAB_NCCL_VERSION_CODE
#error "build with -DLAB_NCCL_VERSION_CODE=<NCCL version code>"
#endif
#ifndef LAB_NCCL_VERSION_STRING
#error "build with -DLAB_NCCL_VERSION_STRING=\"<major.minor.patch>\""
#endif

/* NCCL's result codes that this placeholder can return. */
enum { lab_ncclSuccess = 0, lab_ncclInternalError = 3, lab_ncclInvalidArgument = 4 };

/* A marker `strings libnccl.so.2` shows, so nobody mistakes this file for the real library. */
const char lab_placeholder_notice[] =
    "Kimi lab placeholder libnccl " LAB_NCCL_VERSION_STRING ": version queries only, no communication";

int ncclGetVersion(int *version) {
    if (version == 0) {
        return lab_ncclInvalidArgument;
    }
    *version = LAB_NCCL_VERSION_CODE;
    return lab_ncclSuccess;
}

/* NCCL exports every entry point twice (ncclX and the profiling alias pncclX); keep that shape. */
int pncclGetVersion(int *version) { return ncclGetVersion(version); }

const char *ncclGetErrorString(int result) {
    switch (result) {
    case lab_ncclSuccess:
        return "no error";
    case lab_ncclInvalidArgument:
        return "invalid argument";
    default:
        return "lab placeholder: NCCL communication is not implemented";
    }
}
