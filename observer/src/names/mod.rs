//! Decoding tables for the numbers the probes report: HIP, CUDA driver and
//! CUDA runtime error codes, AMD KFD ioctl numbers, Linux errno values and
//! signals.
//!
//! Only userspace reads these, so they live here rather than in the crate
//! shared with the kernel side. Each table is a `const` slice of
//! `(code, name)` pairs with `&'static str` names, and the lookup
//! functions return `None` for a code the table does not know, so that the
//! caller decides how to format it (e.g. `"hipError(1234)"`).
//!
//! Sources:
//! - HIP: `include/hip/hip_runtime_api.h` of HIP 5.2.3 (Debian
//!   `libamdhip64-dev 5.2.3-8`), of ROCm/HIP at HEAD (Oct 2024) and of
//!   ROCm/rocm-systems `projects/hip` (2025).
//! - CUDA: the `CUresult` enum of the CUDA 12.8 `cuda.h`, plus two codes
//!   added by CUDA 13 (36 and 917).
//! - CUDA runtime: `cudaGetErrorName` of NVIDIA's 13.5 runtime ([`cudart`]).
//! - KFD: upstream `include/uapi/linux/kfd_ioctl.h` (6.1 and 6.12), the
//!   amd-gfx `AMDKFD_IOC_CREATE_PROCESS` series, and ROCm's out-of-tree
//!   `kfd_ioctl.h` (`AMDKFD_COMMAND_START_2 0x80`).
//! - errno and signals: Linux `asm-generic/errno-base.h`, `errno.h`,
//!   `include/linux/errno.h` (kernel-internal codes) and x86_64
//!   `asm/signal.h`.

mod cudart;

use observer_common::kfd::{ioc_nr, ioc_type, KFD_IOCTL_TYPE};

/// `hipError_t` values, one primary name per code.
///
/// Codes with a deprecated alias list the current name: 2 is
/// `hipErrorOutOfMemory` (alias `hipErrorMemoryAllocation`), 3
/// `hipErrorNotInitialized` (`hipErrorInitializationError`), 205
/// `hipErrorMapFailed` (`hipErrorMapBufferObjectFailed`), 400
/// `hipErrorInvalidHandle` (`hipErrorInvalidResourceHandle`).
///
/// Version notes:
/// - 911 and 912 are not in 5.2.3; 914, 915 and 916 appeared in 2025
///   (rocm-systems).
/// - 1054: up to ROCm 6.x this value was `hipErrorTbd`, the end-of-enum
///   marker that no API returns; newer HIP assigns it to
///   `hipErrorInvalidClusterSize` and moves the marker to 1055. Since only the
///   newer meaning can ever be returned, 1054 decodes to
///   `hipErrorInvalidClusterSize`.
pub const HIP_ERRORS: &[(i32, &str)] = &[
    (0, "hipSuccess"),
    (1, "hipErrorInvalidValue"),
    (2, "hipErrorOutOfMemory"),
    (3, "hipErrorNotInitialized"),
    (4, "hipErrorDeinitialized"),
    (5, "hipErrorProfilerDisabled"),
    (6, "hipErrorProfilerNotInitialized"),
    (7, "hipErrorProfilerAlreadyStarted"),
    (8, "hipErrorProfilerAlreadyStopped"),
    (9, "hipErrorInvalidConfiguration"),
    (12, "hipErrorInvalidPitchValue"),
    (13, "hipErrorInvalidSymbol"),
    (17, "hipErrorInvalidDevicePointer"),
    (21, "hipErrorInvalidMemcpyDirection"),
    (35, "hipErrorInsufficientDriver"),
    (52, "hipErrorMissingConfiguration"),
    (53, "hipErrorPriorLaunchFailure"),
    (98, "hipErrorInvalidDeviceFunction"),
    (100, "hipErrorNoDevice"),
    (101, "hipErrorInvalidDevice"),
    (200, "hipErrorInvalidImage"),
    (201, "hipErrorInvalidContext"),
    (202, "hipErrorContextAlreadyCurrent"),
    (205, "hipErrorMapFailed"),
    (206, "hipErrorUnmapFailed"),
    (207, "hipErrorArrayIsMapped"),
    (208, "hipErrorAlreadyMapped"),
    (209, "hipErrorNoBinaryForGpu"),
    (210, "hipErrorAlreadyAcquired"),
    (211, "hipErrorNotMapped"),
    (212, "hipErrorNotMappedAsArray"),
    (213, "hipErrorNotMappedAsPointer"),
    (214, "hipErrorECCNotCorrectable"),
    (215, "hipErrorUnsupportedLimit"),
    (216, "hipErrorContextAlreadyInUse"),
    (217, "hipErrorPeerAccessUnsupported"),
    (218, "hipErrorInvalidKernelFile"),
    (219, "hipErrorInvalidGraphicsContext"),
    (300, "hipErrorInvalidSource"),
    (301, "hipErrorFileNotFound"),
    (302, "hipErrorSharedObjectSymbolNotFound"),
    (303, "hipErrorSharedObjectInitFailed"),
    (304, "hipErrorOperatingSystem"),
    (400, "hipErrorInvalidHandle"),
    (401, "hipErrorIllegalState"),
    (500, "hipErrorNotFound"),
    (600, "hipErrorNotReady"),
    (700, "hipErrorIllegalAddress"),
    (701, "hipErrorLaunchOutOfResources"),
    (702, "hipErrorLaunchTimeOut"),
    (704, "hipErrorPeerAccessAlreadyEnabled"),
    (705, "hipErrorPeerAccessNotEnabled"),
    (708, "hipErrorSetOnActiveProcess"),
    (709, "hipErrorContextIsDestroyed"),
    (710, "hipErrorAssert"),
    (712, "hipErrorHostMemoryAlreadyRegistered"),
    (713, "hipErrorHostMemoryNotRegistered"),
    (719, "hipErrorLaunchFailure"),
    (720, "hipErrorCooperativeLaunchTooLarge"),
    (801, "hipErrorNotSupported"),
    (900, "hipErrorStreamCaptureUnsupported"),
    (901, "hipErrorStreamCaptureInvalidated"),
    (902, "hipErrorStreamCaptureMerge"),
    (903, "hipErrorStreamCaptureUnmatched"),
    (904, "hipErrorStreamCaptureUnjoined"),
    (905, "hipErrorStreamCaptureIsolation"),
    (906, "hipErrorStreamCaptureImplicit"),
    (907, "hipErrorCapturedEvent"),
    (908, "hipErrorStreamCaptureWrongThread"),
    (910, "hipErrorGraphExecUpdateFailure"),
    (911, "hipErrorInvalidChannelDescriptor"),
    (912, "hipErrorInvalidTexture"),
    (914, "hipErrorInvalidResourceType"),
    (915, "hipErrorInvalidResourceConfiguration"),
    (916, "hipErrorStreamDetached"),
    (999, "hipErrorUnknown"),
    (1052, "hipErrorRuntimeMemory"),
    (1053, "hipErrorRuntimeOther"),
    (1054, "hipErrorInvalidClusterSize"),
];

/// CUDA driver API `CUresult` values (`cuda.h`), with their C names.
///
/// ZLUDA maps HIP errors to `CUresult` by identity on the number, so a HIP
/// code surfaces through `libcuda.so` under the CUDA name of the same value.
///
/// Everything up to 916 is from the CUDA 12.8 header (721 and 916 are new in
/// 12.8, 913-915 in 12.4, 225/226/402 in 12.1-12.3).
/// `CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER` (36) and `CUDA_ERROR_STREAM_DETACHED`
/// (917) are CUDA 13 additions.
pub const CU_RESULTS: &[(i32, &str)] = &[
    (0, "CUDA_SUCCESS"),
    (1, "CUDA_ERROR_INVALID_VALUE"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY"),
    (3, "CUDA_ERROR_NOT_INITIALIZED"),
    (4, "CUDA_ERROR_DEINITIALIZED"),
    (5, "CUDA_ERROR_PROFILER_DISABLED"),
    (6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED"),
    (7, "CUDA_ERROR_PROFILER_ALREADY_STARTED"),
    (8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED"),
    (34, "CUDA_ERROR_STUB_LIBRARY"),
    (36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER"),
    (46, "CUDA_ERROR_DEVICE_UNAVAILABLE"),
    (100, "CUDA_ERROR_NO_DEVICE"),
    (101, "CUDA_ERROR_INVALID_DEVICE"),
    (102, "CUDA_ERROR_DEVICE_NOT_LICENSED"),
    (200, "CUDA_ERROR_INVALID_IMAGE"),
    (201, "CUDA_ERROR_INVALID_CONTEXT"),
    (202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT"),
    (205, "CUDA_ERROR_MAP_FAILED"),
    (206, "CUDA_ERROR_UNMAP_FAILED"),
    (207, "CUDA_ERROR_ARRAY_IS_MAPPED"),
    (208, "CUDA_ERROR_ALREADY_MAPPED"),
    (209, "CUDA_ERROR_NO_BINARY_FOR_GPU"),
    (210, "CUDA_ERROR_ALREADY_ACQUIRED"),
    (211, "CUDA_ERROR_NOT_MAPPED"),
    (212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY"),
    (213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER"),
    (214, "CUDA_ERROR_ECC_UNCORRECTABLE"),
    (215, "CUDA_ERROR_UNSUPPORTED_LIMIT"),
    (216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE"),
    (217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"),
    (218, "CUDA_ERROR_INVALID_PTX"),
    (219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT"),
    (220, "CUDA_ERROR_NVLINK_UNCORRECTABLE"),
    (221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND"),
    (222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
    (223, "CUDA_ERROR_JIT_COMPILATION_DISABLED"),
    (224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY"),
    (225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC"),
    (226, "CUDA_ERROR_CONTAINED"),
    (300, "CUDA_ERROR_INVALID_SOURCE"),
    (301, "CUDA_ERROR_FILE_NOT_FOUND"),
    (302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND"),
    (303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED"),
    (304, "CUDA_ERROR_OPERATING_SYSTEM"),
    (400, "CUDA_ERROR_INVALID_HANDLE"),
    (401, "CUDA_ERROR_ILLEGAL_STATE"),
    (402, "CUDA_ERROR_LOSSY_QUERY"),
    (500, "CUDA_ERROR_NOT_FOUND"),
    (600, "CUDA_ERROR_NOT_READY"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
    (702, "CUDA_ERROR_LAUNCH_TIMEOUT"),
    (703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING"),
    (704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"),
    (705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED"),
    (708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"),
    (710, "CUDA_ERROR_ASSERT"),
    (711, "CUDA_ERROR_TOO_MANY_PEERS"),
    (712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"),
    (713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"),
    (714, "CUDA_ERROR_HARDWARE_STACK_ERROR"),
    (715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"),
    (716, "CUDA_ERROR_MISALIGNED_ADDRESS"),
    (717, "CUDA_ERROR_INVALID_ADDRESS_SPACE"),
    (718, "CUDA_ERROR_INVALID_PC"),
    (719, "CUDA_ERROR_LAUNCH_FAILED"),
    (720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"),
    (721, "CUDA_ERROR_TENSOR_MEMORY_LEAK"),
    (800, "CUDA_ERROR_NOT_PERMITTED"),
    (801, "CUDA_ERROR_NOT_SUPPORTED"),
    (802, "CUDA_ERROR_SYSTEM_NOT_READY"),
    (803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
    (804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"),
    (805, "CUDA_ERROR_MPS_CONNECTION_FAILED"),
    (806, "CUDA_ERROR_MPS_RPC_FAILURE"),
    (807, "CUDA_ERROR_MPS_SERVER_NOT_READY"),
    (808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"),
    (809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED"),
    (810, "CUDA_ERROR_MPS_CLIENT_TERMINATED"),
    (811, "CUDA_ERROR_CDP_NOT_SUPPORTED"),
    (812, "CUDA_ERROR_CDP_VERSION_MISMATCH"),
    (900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"),
    (901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"),
    (902, "CUDA_ERROR_STREAM_CAPTURE_MERGE"),
    (903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED"),
    (904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"),
    (905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"),
    (906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"),
    (907, "CUDA_ERROR_CAPTURED_EVENT"),
    (908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"),
    (909, "CUDA_ERROR_TIMEOUT"),
    (910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"),
    (911, "CUDA_ERROR_EXTERNAL_DEVICE"),
    (912, "CUDA_ERROR_INVALID_CLUSTER_SIZE"),
    (913, "CUDA_ERROR_FUNCTION_NOT_LOADED"),
    (914, "CUDA_ERROR_INVALID_RESOURCE_TYPE"),
    (915, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"),
    (916, "CUDA_ERROR_KEY_ROTATION"),
    (917, "CUDA_ERROR_STREAM_DETACHED"),
    (999, "CUDA_ERROR_UNKNOWN"),
];

/// KFD ioctls by `_IOC_NR`, named as `AMDKFD_IOC_<name>`.
///
/// Decode by `_IOC_NR` and never by the full command: the size field changes
/// between kernels (CREATE_QUEUE is 0xC0584B02 on 6.1, 0xC0604B02 on 6.12).
///
/// - 0x01-0x23: upstream since 6.1 (`AMDKFD_COMMAND_END 0x24`).
/// - 0x24-0x26: 6.12 (EXPORT_DMABUF, RUNTIME_ENABLE, DBG_TRAP).
/// - 0x27: CREATE_PROCESS (KFD 1.19, amd-gfx 2025).
/// - 0x80-0x86: ROCm's out-of-tree DKMS driver only (`AMDKFD_COMMAND_START_2`);
///   upstream kernels reject them with EINVAL (ENOTTY after the 2025 change).
///   0x82 was ROCm's `AMDKFD_IOC_DBG_TRAP` before the debugger API went
///   upstream as 0x26. ROCm has since renamed it `DBG_TRAP_DEPRECATED`, and
///   that name is used here so that it differs from 0x26. libhsakmt 5.x still
///   issues it.
pub const KFD_IOCTLS: &[(u32, &str)] = &[
    (0x01, "GET_VERSION"),
    (0x02, "CREATE_QUEUE"),
    (0x03, "DESTROY_QUEUE"),
    (0x04, "SET_MEMORY_POLICY"),
    (0x05, "GET_CLOCK_COUNTERS"),
    (0x06, "GET_PROCESS_APERTURES"),
    (0x07, "UPDATE_QUEUE"),
    (0x08, "CREATE_EVENT"),
    (0x09, "DESTROY_EVENT"),
    (0x0A, "SET_EVENT"),
    (0x0B, "RESET_EVENT"),
    (0x0C, "WAIT_EVENTS"),
    (0x0D, "DBG_REGISTER_DEPRECATED"),
    (0x0E, "DBG_UNREGISTER_DEPRECATED"),
    (0x0F, "DBG_ADDRESS_WATCH_DEPRECATED"),
    (0x10, "DBG_WAVE_CONTROL_DEPRECATED"),
    (0x11, "SET_SCRATCH_BACKING_VA"),
    (0x12, "GET_TILE_CONFIG"),
    (0x13, "SET_TRAP_HANDLER"),
    (0x14, "GET_PROCESS_APERTURES_NEW"),
    (0x15, "ACQUIRE_VM"),
    (0x16, "ALLOC_MEMORY_OF_GPU"),
    (0x17, "FREE_MEMORY_OF_GPU"),
    (0x18, "MAP_MEMORY_TO_GPU"),
    (0x19, "UNMAP_MEMORY_FROM_GPU"),
    (0x1A, "SET_CU_MASK"),
    (0x1B, "GET_QUEUE_WAVE_STATE"),
    (0x1C, "GET_DMABUF_INFO"),
    (0x1D, "IMPORT_DMABUF"),
    (0x1E, "ALLOC_QUEUE_GWS"),
    (0x1F, "SMI_EVENTS"),
    (0x20, "SVM"),
    (0x21, "SET_XNACK_MODE"),
    (0x22, "CRIU_OP"),
    (0x23, "AVAILABLE_MEMORY"),
    (0x24, "EXPORT_DMABUF"),
    (0x25, "RUNTIME_ENABLE"),
    (0x26, "DBG_TRAP"),
    (0x27, "CREATE_PROCESS"),
    (0x80, "IPC_IMPORT_HANDLE"),
    (0x81, "IPC_EXPORT_HANDLE"),
    (0x82, "DBG_TRAP_DEPRECATED"),
    (0x83, "CROSS_MEMORY_COPY"),
    (0x84, "RLC_SPM"),
    (0x85, "PC_SAMPLE"),
    (0x86, "PROFILER"),
];

/// Linux errno names for x86_64 (the asm-generic numbering).
///
/// 1-133 are the user-visible codes. 41 and 58 are unassigned; the aliases
/// `EWOULDBLOCK` (= `EAGAIN`, 11), `EDEADLOCK` (= `EDEADLK`, 35) and `ENOTSUP`
/// (= `EOPNOTSUPP`, 95) are not listed separately.
///
/// 512-531 are kernel-internal codes from `include/linux/errno.h`. User space
/// never sees them, but a kretprobe on a driver function such as `kfd_ioctl`
/// does, e.g. `-ERESTARTSYS` from an interrupted `WAIT_EVENTS`, or
/// `-ENOIOCTLCMD`.
pub const ERRNOS: &[(i32, &str)] = &[
    (1, "EPERM"),
    (2, "ENOENT"),
    (3, "ESRCH"),
    (4, "EINTR"),
    (5, "EIO"),
    (6, "ENXIO"),
    (7, "E2BIG"),
    (8, "ENOEXEC"),
    (9, "EBADF"),
    (10, "ECHILD"),
    (11, "EAGAIN"),
    (12, "ENOMEM"),
    (13, "EACCES"),
    (14, "EFAULT"),
    (15, "ENOTBLK"),
    (16, "EBUSY"),
    (17, "EEXIST"),
    (18, "EXDEV"),
    (19, "ENODEV"),
    (20, "ENOTDIR"),
    (21, "EISDIR"),
    (22, "EINVAL"),
    (23, "ENFILE"),
    (24, "EMFILE"),
    (25, "ENOTTY"),
    (26, "ETXTBSY"),
    (27, "EFBIG"),
    (28, "ENOSPC"),
    (29, "ESPIPE"),
    (30, "EROFS"),
    (31, "EMLINK"),
    (32, "EPIPE"),
    (33, "EDOM"),
    (34, "ERANGE"),
    (35, "EDEADLK"),
    (36, "ENAMETOOLONG"),
    (37, "ENOLCK"),
    (38, "ENOSYS"),
    (39, "ENOTEMPTY"),
    (40, "ELOOP"),
    (42, "ENOMSG"),
    (43, "EIDRM"),
    (44, "ECHRNG"),
    (45, "EL2NSYNC"),
    (46, "EL3HLT"),
    (47, "EL3RST"),
    (48, "ELNRNG"),
    (49, "EUNATCH"),
    (50, "ENOCSI"),
    (51, "EL2HLT"),
    (52, "EBADE"),
    (53, "EBADR"),
    (54, "EXFULL"),
    (55, "ENOANO"),
    (56, "EBADRQC"),
    (57, "EBADSLT"),
    (59, "EBFONT"),
    (60, "ENOSTR"),
    (61, "ENODATA"),
    (62, "ETIME"),
    (63, "ENOSR"),
    (64, "ENONET"),
    (65, "ENOPKG"),
    (66, "EREMOTE"),
    (67, "ENOLINK"),
    (68, "EADV"),
    (69, "ESRMNT"),
    (70, "ECOMM"),
    (71, "EPROTO"),
    (72, "EMULTIHOP"),
    (73, "EDOTDOT"),
    (74, "EBADMSG"),
    (75, "EOVERFLOW"),
    (76, "ENOTUNIQ"),
    (77, "EBADFD"),
    (78, "EREMCHG"),
    (79, "ELIBACC"),
    (80, "ELIBBAD"),
    (81, "ELIBSCN"),
    (82, "ELIBMAX"),
    (83, "ELIBEXEC"),
    (84, "EILSEQ"),
    (85, "ERESTART"),
    (86, "ESTRPIPE"),
    (87, "EUSERS"),
    (88, "ENOTSOCK"),
    (89, "EDESTADDRREQ"),
    (90, "EMSGSIZE"),
    (91, "EPROTOTYPE"),
    (92, "ENOPROTOOPT"),
    (93, "EPROTONOSUPPORT"),
    (94, "ESOCKTNOSUPPORT"),
    (95, "EOPNOTSUPP"),
    (96, "EPFNOSUPPORT"),
    (97, "EAFNOSUPPORT"),
    (98, "EADDRINUSE"),
    (99, "EADDRNOTAVAIL"),
    (100, "ENETDOWN"),
    (101, "ENETUNREACH"),
    (102, "ENETRESET"),
    (103, "ECONNABORTED"),
    (104, "ECONNRESET"),
    (105, "ENOBUFS"),
    (106, "EISCONN"),
    (107, "ENOTCONN"),
    (108, "ESHUTDOWN"),
    (109, "ETOOMANYREFS"),
    (110, "ETIMEDOUT"),
    (111, "ECONNREFUSED"),
    (112, "EHOSTDOWN"),
    (113, "EHOSTUNREACH"),
    (114, "EALREADY"),
    (115, "EINPROGRESS"),
    (116, "ESTALE"),
    (117, "EUCLEAN"),
    (118, "ENOTNAM"),
    (119, "ENAVAIL"),
    (120, "EISNAM"),
    (121, "EREMOTEIO"),
    (122, "EDQUOT"),
    (123, "ENOMEDIUM"),
    (124, "EMEDIUMTYPE"),
    (125, "ECANCELED"),
    (126, "ENOKEY"),
    (127, "EKEYEXPIRED"),
    (128, "EKEYREVOKED"),
    (129, "EKEYREJECTED"),
    (130, "EOWNERDEAD"),
    (131, "ENOTRECOVERABLE"),
    (132, "ERFKILL"),
    (133, "EHWPOISON"),
    // Kernel-internal (include/linux/errno.h).
    (512, "ERESTARTSYS"),
    (513, "ERESTARTNOINTR"),
    (514, "ERESTARTNOHAND"),
    (515, "ENOIOCTLCMD"),
    (516, "ERESTART_RESTARTBLOCK"),
    (517, "EPROBE_DEFER"),
    (518, "EOPENSTALE"),
    (519, "ENOPARAM"),
    (521, "EBADHANDLE"),
    (522, "ENOTSYNC"),
    (523, "EBADCOOKIE"),
    (524, "ENOTSUPP"),
    (525, "ETOOSMALL"),
    (526, "ESERVERFAULT"),
    (527, "EBADTYPE"),
    (528, "EJUKEBOX"),
    (529, "EIOCBQUEUED"),
    (530, "ERECALLCONFLICT"),
    (531, "ENOGRACE"),
];

/// Linux x86_64 standard signals 1-31. The aliases `SIGIOT` (6), `SIGPOLL`
/// (29) and `SIGLOST` (29) are not listed separately. Real-time signals
/// (`SIGRTMIN`=32 and up) are not named.
pub const SIGNALS: &[(i32, &str)] = &[
    (1, "SIGHUP"),
    (2, "SIGINT"),
    (3, "SIGQUIT"),
    (4, "SIGILL"),
    (5, "SIGTRAP"),
    (6, "SIGABRT"),
    (7, "SIGBUS"),
    (8, "SIGFPE"),
    (9, "SIGKILL"),
    (10, "SIGUSR1"),
    (11, "SIGSEGV"),
    (12, "SIGUSR2"),
    (13, "SIGPIPE"),
    (14, "SIGALRM"),
    (15, "SIGTERM"),
    (16, "SIGSTKFLT"),
    (17, "SIGCHLD"),
    (18, "SIGCONT"),
    (19, "SIGSTOP"),
    (20, "SIGTSTP"),
    (21, "SIGTTIN"),
    (22, "SIGTTOU"),
    (23, "SIGURG"),
    (24, "SIGXCPU"),
    (25, "SIGXFSZ"),
    (26, "SIGVTALRM"),
    (27, "SIGPROF"),
    (28, "SIGWINCH"),
    (29, "SIGIO"),
    (30, "SIGPWR"),
    (31, "SIGSYS"),
];

/// Linear lookup in a `(code, name)` table. The tables are small (< 200
/// entries) and these lookups happen once per event in user space.
fn lookup<K: Copy + PartialEq>(table: &[(K, &'static str)], key: K) -> Option<&'static str> {
    table.iter().find(|&&(k, _)| k == key).map(|&(_, name)| name)
}

/// Name of a `hipError_t` value, e.g. `hip_error_name(700)` is
/// `Some("hipErrorIllegalAddress")`.
pub fn hip_error_name(code: i32) -> Option<&'static str> {
    lookup(HIP_ERRORS, code)
}

/// Name of a CUDA driver `CUresult`, e.g. `cu_result_name(719)` is
/// `Some("CUDA_ERROR_LAUNCH_FAILED")` and `cu_result_name(0)` is
/// `Some("CUDA_SUCCESS")`.
pub fn cu_result_name(code: i32) -> Option<&'static str> {
    lookup(CU_RESULTS, code)
}

/// Name of a CUDA runtime `cudaError_t`, e.g. `cuda_error_name(35)` is
/// `Some("cudaErrorInsufficientDriver")`.
pub fn cuda_error_name(code: i32) -> Option<&'static str> {
    lookup(cudart::CUDART_ERRORS, code)
}

/// A CUDA version as the driver reports it (`1000 * major + 10 * minor`):
/// `cuda_version(12020)` is `"12.2"`.
pub fn cuda_version(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

/// Name of a KFD ioctl by its `_IOC_NR`, without the `AMDKFD_IOC_` prefix,
/// e.g. `kfd_ioctl_name(0x02)` is `Some("CREATE_QUEUE")`.
///
/// The caller must already know that the command's type is
/// [`KFD_IOCTL_TYPE`]; [`kfd_ioctl_cmd_name`] checks that for a full command.
pub fn kfd_ioctl_name(nr: u32) -> Option<&'static str> {
    lookup(KFD_IOCTLS, nr)
}

/// Name of a full KFD ioctl command (e.g. 0xC0604B02 gives
/// `Some("CREATE_QUEUE")`), or `None` when its type is not `'K'` or its
/// number is unknown. Direction and size bits are ignored.
pub fn kfd_ioctl_cmd_name(cmd: u32) -> Option<&'static str> {
    if ioc_type(cmd) == KFD_IOCTL_TYPE {
        kfd_ioctl_name(ioc_nr(cmd))
    } else {
        None
    }
}

/// Name of a Linux errno value, e.g. `errno_name(25)` is `Some("ENOTTY")`.
///
/// Both signs are accepted: `errno_name(-22)` is also `Some("EINVAL")`,
/// because kernel functions (and raw syscall returns) report `-errno`. 0 is
/// not an error and gives `None`.
pub fn errno_name(errno: i32) -> Option<&'static str> {
    // unsigned_abs: no overflow on i32::MIN, whose magnitude then fails try_from.
    let magnitude = i32::try_from(errno.unsigned_abs()).ok()?;
    lookup(ERRNOS, magnitude)
}

/// Name of a Linux x86_64 signal 1-31, e.g. `signal_name(9)` is
/// `Some("SIGKILL")`.
pub fn signal_name(sig: i32) -> Option<&'static str> {
    lookup(SIGNALS, sig)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_versions_read_as_major_dot_minor() {
        assert_eq!(cuda_version(12020), "12.2");
        assert_eq!(cuda_version(13000), "13.0");
        assert_eq!(cuda_version(11080), "11.8");
    }

    /// Panics naming the first code that appears twice in `table`.
    fn assert_unique_codes<K: Copy + PartialEq + core::fmt::Debug>(what: &str, table: &[(K, &str)]) {
        for (i, (a, _)) in table.iter().enumerate() {
            for (b, _) in &table[i + 1..] {
                assert!(a != b, "{what}: code {a:?} listed twice");
            }
        }
    }

    /// Panics naming the first name that appears twice in `table`.
    fn assert_unique_names<K>(what: &str, table: &[(K, &str)]) {
        for (i, (_, a)) in table.iter().enumerate() {
            for (_, b) in &table[i + 1..] {
                assert!(a != b, "{what}: name {a} listed twice");
            }
        }
    }

    /// Codes ascend strictly: keeps the tables readable and catches both
    /// duplicates and misplaced rows.
    fn assert_sorted<K: Copy + PartialOrd + core::fmt::Debug>(what: &str, table: &[(K, &str)]) {
        for pair in table.windows(2) {
            assert!(pair[0].0 < pair[1].0, "{what}: {:?} before {:?}", pair[0].0, pair[1].0);
        }
    }

    #[test]
    fn tables_have_no_duplicate_codes() {
        assert_unique_codes("HIP", HIP_ERRORS);
        assert_unique_codes("CUresult", CU_RESULTS);
        assert_unique_codes("KFD", KFD_IOCTLS);
        assert_unique_codes("errno", ERRNOS);
        assert_unique_codes("signal", SIGNALS);
    }

    #[test]
    fn tables_have_no_duplicate_names() {
        assert_unique_names("HIP", HIP_ERRORS);
        assert_unique_names("CUresult", CU_RESULTS);
        assert_unique_names("KFD", KFD_IOCTLS);
        assert_unique_names("errno", ERRNOS);
        assert_unique_names("signal", SIGNALS);
    }

    #[test]
    fn tables_are_sorted() {
        assert_sorted("HIP", HIP_ERRORS);
        assert_sorted("CUresult", CU_RESULTS);
        assert_sorted("KFD", KFD_IOCTLS);
        assert_sorted("errno", ERRNOS);
        assert_sorted("signal", SIGNALS);
    }

    #[test]
    fn names_are_well_formed() {
        for &(_, n) in HIP_ERRORS {
            assert!(n == "hipSuccess" || n.starts_with("hipError"), "{n}");
            assert!(n.bytes().all(|b| b.is_ascii_alphanumeric()), "{n}");
        }
        for &(_, n) in CU_RESULTS {
            assert!(n == "CUDA_SUCCESS" || n.starts_with("CUDA_ERROR_"), "{n}");
        }
        let kfd = KFD_IOCTLS.iter().map(|&(_, n)| n);
        let others = ERRNOS.iter().chain(SIGNALS).map(|&(_, n)| n);
        for n in kfd.chain(others) {
            assert!(!n.is_empty());
            assert!(n.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'), "{n}");
        }
        for &(_, n) in ERRNOS {
            assert!(n.starts_with('E'), "{n}");
        }
        for &(_, n) in SIGNALS {
            assert!(n.starts_with("SIG"), "{n}");
        }
    }

    #[test]
    fn hip_important_codes() {
        let cases = [
            (0, "hipSuccess"),
            (1, "hipErrorInvalidValue"),
            (2, "hipErrorOutOfMemory"),
            (3, "hipErrorNotInitialized"),
            (4, "hipErrorDeinitialized"),
            (98, "hipErrorInvalidDeviceFunction"),
            (100, "hipErrorNoDevice"),
            (101, "hipErrorInvalidDevice"),
            (205, "hipErrorMapFailed"),
            (209, "hipErrorNoBinaryForGpu"),
            (218, "hipErrorInvalidKernelFile"),
            (400, "hipErrorInvalidHandle"),
            (600, "hipErrorNotReady"),
            (700, "hipErrorIllegalAddress"),
            (701, "hipErrorLaunchOutOfResources"),
            (702, "hipErrorLaunchTimeOut"),
            (710, "hipErrorAssert"),
            (719, "hipErrorLaunchFailure"),
            (720, "hipErrorCooperativeLaunchTooLarge"),
            (801, "hipErrorNotSupported"),
            (910, "hipErrorGraphExecUpdateFailure"),
            (911, "hipErrorInvalidChannelDescriptor"),
            (912, "hipErrorInvalidTexture"),
            (916, "hipErrorStreamDetached"),
            (999, "hipErrorUnknown"),
            (1052, "hipErrorRuntimeMemory"),
            (1053, "hipErrorRuntimeOther"),
            (1054, "hipErrorInvalidClusterSize"),
        ];
        for (code, name) in cases {
            assert_eq!(hip_error_name(code), Some(name), "code {code}");
        }
    }

    #[test]
    fn hip_table_matches_5_2_3_header_ranges() {
        // Every 5.2.3 enumerator below 911 is present, and the 900-908
        // stream-capture block is contiguous.
        for code in [5, 6, 7, 8, 9, 12, 13, 17, 21, 35, 52, 53] {
            assert!(hip_error_name(code).is_some(), "{code}");
        }
        for code in 200..=219 {
            let expected = !matches!(code, 203 | 204);
            assert_eq!(hip_error_name(code).is_some(), expected, "{code}");
        }
        for code in 300..=304 {
            assert!(hip_error_name(code).is_some(), "{code}");
        }
        for code in 900..=908 {
            assert!(hip_error_name(code).is_some(), "{code}");
        }
        assert_eq!(hip_error_name(909), None);
        assert_eq!(HIP_ERRORS.len(), 79);
    }

    #[test]
    fn hip_unknown_codes() {
        for code in [
            -1,
            10,
            11,
            14,
            99,
            102,
            203,
            703,
            706,
            711,
            800,
            909,
            913,
            998,
            1000,
            1051,
            1055,
            i32::MIN,
            i32::MAX,
        ] {
            assert_eq!(hip_error_name(code), None, "code {code}");
        }
    }

    #[test]
    fn cu_important_codes() {
        let cases = [
            (0, "CUDA_SUCCESS"),
            (1, "CUDA_ERROR_INVALID_VALUE"),
            (2, "CUDA_ERROR_OUT_OF_MEMORY"),
            (3, "CUDA_ERROR_NOT_INITIALIZED"),
            (4, "CUDA_ERROR_DEINITIALIZED"),
            (5, "CUDA_ERROR_PROFILER_DISABLED"),
            (34, "CUDA_ERROR_STUB_LIBRARY"),
            (46, "CUDA_ERROR_DEVICE_UNAVAILABLE"),
            (100, "CUDA_ERROR_NO_DEVICE"),
            (101, "CUDA_ERROR_INVALID_DEVICE"),
            (200, "CUDA_ERROR_INVALID_IMAGE"),
            (201, "CUDA_ERROR_INVALID_CONTEXT"),
            (209, "CUDA_ERROR_NO_BINARY_FOR_GPU"),
            (218, "CUDA_ERROR_INVALID_PTX"),
            (222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
            (225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC"),
            (300, "CUDA_ERROR_INVALID_SOURCE"),
            (301, "CUDA_ERROR_FILE_NOT_FOUND"),
            (304, "CUDA_ERROR_OPERATING_SYSTEM"),
            (400, "CUDA_ERROR_INVALID_HANDLE"),
            (401, "CUDA_ERROR_ILLEGAL_STATE"),
            (500, "CUDA_ERROR_NOT_FOUND"),
            (600, "CUDA_ERROR_NOT_READY"),
            (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
            (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
            (702, "CUDA_ERROR_LAUNCH_TIMEOUT"),
            (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"),
            (710, "CUDA_ERROR_ASSERT"),
            (714, "CUDA_ERROR_HARDWARE_STACK_ERROR"),
            (715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"),
            (716, "CUDA_ERROR_MISALIGNED_ADDRESS"),
            (719, "CUDA_ERROR_LAUNCH_FAILED"),
            (720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"),
            (800, "CUDA_ERROR_NOT_PERMITTED"),
            (801, "CUDA_ERROR_NOT_SUPPORTED"),
            (812, "CUDA_ERROR_CDP_VERSION_MISMATCH"),
            (900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"),
            (910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"),
            (999, "CUDA_ERROR_UNKNOWN"),
        ];
        for (code, name) in cases {
            assert_eq!(cu_result_name(code), Some(name), "code {code}");
        }
    }

    #[test]
    fn cu_contiguous_blocks_are_complete() {
        for range in [200..=202, 205..=226, 300..=304, 400..=402, 700..=705, 708..=721, 800..=812, 900..=917]
        {
            for code in range {
                assert!(cu_result_name(code).is_some(), "code {code}");
            }
        }
    }

    #[test]
    fn cu_unknown_codes() {
        for code in [
            -1,
            9,
            35,
            47,
            99,
            103,
            203,
            227,
            305,
            403,
            501,
            601,
            706,
            707,
            722,
            813,
            918,
            1000,
            i32::MIN,
            i32::MAX,
        ] {
            assert_eq!(cu_result_name(code), None, "code {code}");
        }
    }

    #[test]
    fn zluda_identity_mapping_shares_key_codes() {
        // ZLUDA forwards HIP codes unchanged; the crash codes that matter must
        // mean the same thing in both tables.
        assert_eq!(hip_error_name(100), Some("hipErrorNoDevice"));
        assert_eq!(cu_result_name(100), Some("CUDA_ERROR_NO_DEVICE"));
        assert_eq!(hip_error_name(700), Some("hipErrorIllegalAddress"));
        assert_eq!(cu_result_name(700), Some("CUDA_ERROR_ILLEGAL_ADDRESS"));
        assert_eq!(hip_error_name(719), Some("hipErrorLaunchFailure"));
        assert_eq!(cu_result_name(719), Some("CUDA_ERROR_LAUNCH_FAILED"));
    }

    #[test]
    fn kfd_ioctl_numbers() {
        let cases = [
            (0x01, "GET_VERSION"),
            (0x02, "CREATE_QUEUE"),
            (0x03, "DESTROY_QUEUE"),
            (0x06, "GET_PROCESS_APERTURES"),
            (0x08, "CREATE_EVENT"),
            (0x0C, "WAIT_EVENTS"),
            (0x0D, "DBG_REGISTER_DEPRECATED"),
            (0x10, "DBG_WAVE_CONTROL_DEPRECATED"),
            (0x11, "SET_SCRATCH_BACKING_VA"),
            (0x13, "SET_TRAP_HANDLER"),
            (0x14, "GET_PROCESS_APERTURES_NEW"),
            (0x15, "ACQUIRE_VM"),
            (0x16, "ALLOC_MEMORY_OF_GPU"),
            (0x18, "MAP_MEMORY_TO_GPU"),
            (0x1F, "SMI_EVENTS"),
            (0x20, "SVM"),
            (0x21, "SET_XNACK_MODE"),
            (0x23, "AVAILABLE_MEMORY"),
            (0x24, "EXPORT_DMABUF"),
            (0x25, "RUNTIME_ENABLE"),
            (0x26, "DBG_TRAP"),
            (0x27, "CREATE_PROCESS"),
            (0x80, "IPC_IMPORT_HANDLE"),
            (0x81, "IPC_EXPORT_HANDLE"),
            (0x82, "DBG_TRAP_DEPRECATED"),
            (0x83, "CROSS_MEMORY_COPY"),
            (0x84, "RLC_SPM"),
            (0x85, "PC_SAMPLE"),
            (0x86, "PROFILER"),
        ];
        for (nr, name) in cases {
            assert_eq!(kfd_ioctl_name(nr), Some(name), "nr {nr:#x}");
        }
        // The upstream range 0x01..=0x27 has no gap.
        for nr in 0x01..=0x27 {
            assert!(kfd_ioctl_name(nr).is_some(), "nr {nr:#x}");
        }
    }

    #[test]
    fn kfd_unknown_numbers() {
        for nr in [0x00, 0x28, 0x29, 0x4B, 0x7F, 0x87, 0xFF, 0x100, 0x102, u32::MAX] {
            assert_eq!(kfd_ioctl_name(nr), None, "nr {nr:#x}");
        }
    }

    #[test]
    fn ioc_field_extraction() {
        assert_eq!(KFD_IOCTL_TYPE, 0x4B);
        // Full commands as the `AMDKFD_IO*` macros of `kfd_ioctl.h` build them.
        let cases = [
            (0x8008_4B01, 0x01, "GET_VERSION"),
            (0xC058_4B02, 0x02, "CREATE_QUEUE"), // 6.1, 88-byte args
            (0xC060_4B02, 0x02, "CREATE_QUEUE"), // 6.12, 96-byte args
            (0x4008_4B15, 0x15, "ACQUIRE_VM"),
            (0xC010_4B25, 0x25, "RUNTIME_ENABLE"),
            (0xC020_4B26, 0x26, "DBG_TRAP"),
            (0xC030_4B80, 0x80, "IPC_IMPORT_HANDLE"),
            (0x0000_4B27, 0x27, "CREATE_PROCESS"), // AMDKFD_IO: no dir, no size
        ];
        for (cmd, nr, name) in cases {
            assert_eq!(ioc_type(cmd), KFD_IOCTL_TYPE, "cmd {cmd:#x}");
            assert_eq!(ioc_nr(cmd), nr, "cmd {cmd:#x}");
            assert_eq!(kfd_ioctl_name(ioc_nr(cmd)), Some(name));
            assert_eq!(kfd_ioctl_cmd_name(cmd), Some(name));
        }
        // Other types are rejected even when the number would match.
        assert_eq!(ioc_type(0x8004_6402), 0x64); // DRM 'd'
        assert_eq!(kfd_ioctl_cmd_name(0x8004_6402), None);
        assert_eq!(kfd_ioctl_cmd_name(0x5401), None); // TCGETS
        assert_eq!(kfd_ioctl_cmd_name(0), None);
        assert_eq!(kfd_ioctl_cmd_name(u32::MAX), None);
        assert_eq!(kfd_ioctl_cmd_name(0xC008_4B99), None);
        assert_eq!(ioc_nr(u32::MAX), 0xff);
        assert_eq!(ioc_type(u32::MAX), 0xff);
    }

    #[test]
    fn errno_names() {
        let cases = [
            (1, "EPERM"),
            (2, "ENOENT"),
            (4, "EINTR"),
            (5, "EIO"),
            (9, "EBADF"),
            (11, "EAGAIN"),
            (12, "ENOMEM"),
            (13, "EACCES"),
            (14, "EFAULT"),
            (16, "EBUSY"),
            (19, "ENODEV"),
            (22, "EINVAL"),
            (25, "ENOTTY"),
            (28, "ENOSPC"),
            (32, "EPIPE"),
            (35, "EDEADLK"),
            (38, "ENOSYS"),
            (61, "ENODATA"),
            (62, "ETIME"),
            (95, "EOPNOTSUPP"),
            (110, "ETIMEDOUT"),
            (111, "ECONNREFUSED"),
            (125, "ECANCELED"),
            (133, "EHWPOISON"),
            (512, "ERESTARTSYS"),
            (515, "ENOIOCTLCMD"),
            (524, "ENOTSUPP"),
            (531, "ENOGRACE"),
        ];
        for (e, name) in cases {
            assert_eq!(errno_name(e), Some(name), "errno {e}");
            assert_eq!(errno_name(-e), Some(name), "errno -{e}");
        }
    }

    #[test]
    fn errno_user_range_is_complete() {
        for e in 1..=133 {
            let expected = !matches!(e, 41 | 58);
            assert_eq!(errno_name(e).is_some(), expected, "errno {e}");
        }
        assert_eq!(ERRNOS.iter().filter(|&&(e, _)| e <= 133).count(), 131);
    }

    #[test]
    fn errno_unknown_values() {
        for e in [0, 41, 58, 134, 200, 511, 520, 532, 4095, 4096, i32::MAX, i32::MIN, -i32::MAX] {
            assert_eq!(errno_name(e), None, "errno {e}");
        }
    }

    #[test]
    fn signal_names() {
        let cases = [
            (1, "SIGHUP"),
            (2, "SIGINT"),
            (3, "SIGQUIT"),
            (4, "SIGILL"),
            (5, "SIGTRAP"),
            (6, "SIGABRT"),
            (7, "SIGBUS"),
            (8, "SIGFPE"),
            (9, "SIGKILL"),
            (11, "SIGSEGV"),
            (13, "SIGPIPE"),
            (15, "SIGTERM"),
            (17, "SIGCHLD"),
            (19, "SIGSTOP"),
            (24, "SIGXCPU"),
            (25, "SIGXFSZ"),
            (29, "SIGIO"),
            (31, "SIGSYS"),
        ];
        for (s, name) in cases {
            assert_eq!(signal_name(s), Some(name), "signal {s}");
        }
        for s in 1..=31 {
            assert!(signal_name(s).is_some(), "signal {s}");
        }
        assert_eq!(SIGNALS.len(), 31);
    }

    #[test]
    fn signal_unknown_values() {
        for s in [0, -1, -9, 32, 33, 64, 65, 128, i32::MIN, i32::MAX] {
            assert_eq!(signal_name(s), None, "signal {s}");
        }
    }
}
