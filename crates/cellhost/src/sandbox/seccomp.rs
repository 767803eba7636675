//! The strict profile's seccomp filters: kernel interfaces agent code never
//! needs fail with `EPERM`, so a bug in one of them is out of reach.
//!
//! Compiled once per host process with `seccompiler` (and one hand-written
//! program) and handed to bubblewrap as `--add-seccomp-fd`, which loads them
//! after building the sandbox, right before it execs the kernel: bwrap
//! itself may still mount, the kernel may not. Three programs, because one
//! seccompiler filter has one action:
//!
//! 1. [`DENIED`] (plus [`DENIED_RLIMIT_MEMORY`] when memory is bounded by
//!    rlimits only): `EPERM`; `clone`/`unshare` only with a namespace flag;
//!    `personality` only for a change of persona (queries and the plain
//!    Linux personas pass).
//! 2. `clone3` fails with `ENOSYS`: its flags live in memory that a filter
//!    cannot read, so libc falls back to `clone`, whose flags it can.
//! 3. (x86_64) every x32-ABI syscall number (bit 30 set) fails with `EPERM`:
//!    they would otherwise be a second name for each denied call.
//!
//! A foreign architecture's syscalls (`int 0x80` on x86_64) kill the
//! process (seccompiler's architecture check). To extend the list, add a
//! `(name, number)` to [`DENIED`]; `docs/sandbox.md` says what each
//! entry defends.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Denied outright with `EPERM` (name for the docs and tests, number).
pub(crate) const DENIED: &[(&str, i64)] = &[
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("setns", libc::SYS_setns),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
];

/// Denied too when no cgroup bounds the kernel's memory: `RLIMIT_AS`
/// counts mapped pages only, and these hold memory no mapping shows
/// (an unmapped memfd, a detached System V segment).
pub(crate) const DENIED_RLIMIT_MEMORY: &[(&str, i64)] = &[
    ("memfd_create", libc::SYS_memfd_create),
    ("memfd_secret", libc::SYS_memfd_secret),
    ("shmget", libc::SYS_shmget),
];

/// `clone`/`unshare` flags that make a namespace (each denied).
const NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
    0x80, // CLONE_NEWTIME
];

/// `personality` values that pass: the query and the plain Linux personas
/// (Docker's default profile allows the same).
const PERSONAS: &[u64] = &[0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// The compiled programs, as bytes for `--add-seccomp-fd`.
pub(crate) struct Programs {
    pub programs: Vec<Vec<u8>>,
}

/// Why no filter could be built (an architecture seccompiler lacks, or a
/// bug in a rule): the strict kernel is refused rather than run without.
#[derive(Debug, Clone)]
pub(crate) struct Unavailable(pub String);

/// The programs for a kernel; `rlimit_memory`: memory is bounded by
/// rlimits only. Built once per variant.
pub(crate) fn programs(rlimit_memory: bool) -> Result<&'static Programs, Unavailable> {
    static CGROUP: OnceLock<Result<Programs, Unavailable>> = OnceLock::new();
    static RLIMIT: OnceLock<Result<Programs, Unavailable>> = OnceLock::new();
    let cell = if rlimit_memory { &RLIMIT } else { &CGROUP };
    cell.get_or_init(|| build(rlimit_memory, &[]))
        .as_ref()
        .map_err(Clone::clone)
}

/// The calls a strict template's fork moves its mounts with, at its
/// hand-over (`runner/strictfork.py`).
pub(crate) const SEAL_CALLS: &[(&str, i64)] = &[
    ("umount2", libc::SYS_umount2),
    ("move_mount", libc::SYS_move_mount),
];

/// A strict template's fork's filter in two parts (docs/templates.md):
/// `before`, loaded before it waits, is the kernel's but for
/// [`SEAL_CALLS`]; `sealed`, loaded once its mounts are in place at the
/// hand-over, denies those. Together they decide every call as
/// [`programs`] does (a test checks, call by call); `sealed` is a small
/// program, so the hand-over loads in microseconds what would otherwise
/// cost a few hundred (most of it the kernel compiling the big one).
pub(crate) struct ForkPrograms {
    pub before: Programs,
    pub sealed: Vec<u8>,
}

/// The fork's programs for `rlimit_memory` (as [`programs`]).
pub(crate) fn fork_programs(rlimit_memory: bool) -> Result<&'static ForkPrograms, Unavailable> {
    static CGROUP: OnceLock<Result<ForkPrograms, Unavailable>> = OnceLock::new();
    static RLIMIT: OnceLock<Result<ForkPrograms, Unavailable>> = OnceLock::new();
    let cell = if rlimit_memory { &RLIMIT } else { &CGROUP };
    cell.get_or_init(|| {
        let except: Vec<i64> = SEAL_CALLS.iter().map(|(_, nr)| *nr).collect();
        let arch: TargetArch = std::env::consts::ARCH.try_into().map_err(fail)?;
        let sealed = SeccompFilter::new(
            except.iter().map(|nr| (*nr, Vec::new())).collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            arch,
        )
        .map_err(fail)?;
        Ok(ForkPrograms {
            before: build(rlimit_memory, &except)?,
            sealed: bytes(&BpfProgram::try_from(sealed).map_err(fail)?),
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

fn fail(e: impl std::fmt::Display) -> Unavailable {
    Unavailable(e.to_string())
}

/// The kernel's programs, but with the calls in `except` allowed.
fn build(rlimit_memory: bool, except: &[i64]) -> Result<Programs, Unavailable> {
    let arch: TargetArch = std::env::consts::ARCH.try_into().map_err(fail)?;
    let cond = |arg: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let denied = DENIED.iter().chain(if rlimit_memory {
        DENIED_RLIMIT_MEMORY
    } else {
        &[]
    });
    for (_, nr) in denied.filter(|(_, nr)| !except.contains(nr)) {
        rules.insert(*nr, Vec::new());
    }
    for nr in [libc::SYS_clone, libc::SYS_unshare] {
        let flag_rules = NAMESPACE_FLAGS
            .iter()
            .map(|&flag| {
                let flag = u64::from(flag as u32);
                SeccompRule::new(vec![cond(0, SeccompCmpOp::MaskedEq(flag), flag)?])
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(fail)?;
        rules.insert(nr, flag_rules);
    }
    let not_a_persona = PERSONAS
        .iter()
        .map(|&p| cond(0, SeccompCmpOp::Ne, p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(fail)?;
    rules.insert(
        libc::SYS_personality,
        vec![SeccompRule::new(not_a_persona).map_err(fail)?],
    );
    let eperm = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(fail)?;
    let enosys = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(fail)?;
    let mut programs = Vec::new();
    for filter in [eperm, enosys] {
        let bpf = BpfProgram::try_from(filter).map_err(fail)?;
        programs.push(bytes(&bpf));
    }
    if arch == TargetArch::x86_64 {
        programs.push(x32_denied());
    }
    Ok(Programs { programs })
}

/// The kernel's `struct sock_filter` array, in native byte order.
fn bytes(bpf: &BpfProgram) -> Vec<u8> {
    let mut out = Vec::with_capacity(bpf.len() * 8);
    for ins in bpf {
        out.extend_from_slice(&ins.code.to_ne_bytes());
        out.push(ins.jt);
        out.push(ins.jf);
        out.extend_from_slice(&ins.k.to_ne_bytes());
    }
    out
}

/// `EPERM` for every syscall number with the x32 bit (x86_64 only).
fn x32_denied() -> Vec<u8> {
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const ALLOW: u32 = 0x7fff_0000;
    const ERRNO: u32 = 0x0005_0000;
    // struct seccomp_data { int nr; __u32 arch; ... }
    let prog: [(u16, u8, u8, u32); 6] = [
        (LD_W_ABS, 0, 0, 4),
        (JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        (RET_K, 0, 0, ALLOW),
        (LD_W_ABS, 0, 0, 0),
        (JGE_K, 0, 1, X32_SYSCALL_BIT),
        (RET_K, 0, 0, ERRNO | libc::EPERM as u32),
    ];
    let mut out = Vec::new();
    for (code, jt, jf, k) in prog {
        out.extend_from_slice(&code.to_ne_bytes());
        out.push(jt);
        out.push(jf);
        out.extend_from_slice(&k.to_ne_bytes());
    }
    out.extend_from_slice(&RET_K.to_ne_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&ALLOW.to_ne_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_variants_compile_and_the_rlimit_one_is_longer() {
        let cg = programs(false).unwrap();
        let rl = programs(true).unwrap();
        assert!(cg.programs.len() >= 2);
        assert!(rl.programs[0].len() > cg.programs[0].len());
        for p in &cg.programs {
            assert_eq!(p.len() % 8, 0);
            assert!(p.len() / 8 < 4096, "BPF_MAXINSNS");
        }
    }

    /// What a cBPF program returns for a call (the instructions
    /// seccompiler and `x32_denied` emit; any other fails the test).
    fn run(prog: &[u8], data: &[u8; 64]) -> u32 {
        let ins: Vec<(u16, u8, u8, u32)> = prog
            .chunks(8)
            .map(|c| {
                (
                    u16::from_ne_bytes([c[0], c[1]]),
                    c[2],
                    c[3],
                    u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
                )
            })
            .collect();
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let (code, jt, jf, k) = ins[pc];
            pc += 1;
            let jump = |cond: bool| if cond { jt as usize } else { jf as usize };
            match code {
                0x20 => {
                    let at = k as usize;
                    a = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                }
                0x54 => a &= k,                 // ALU AND K
                0x05 => pc += k as usize,       // JA
                0x15 => pc += jump(a == k),     // JEQ K
                0x25 => pc += jump(a > k),      // JGT K
                0x35 => pc += jump(a >= k),     // JGE K
                0x45 => pc += jump(a & k != 0), // JSET K
                0x06 => return k,               // RET K
                other => panic!("opcode {other:#x} at {}", pc - 1),
            }
        }
    }

    /// The kernel's verdict over filters: the action of highest
    /// precedence (lowest as a signed action) wins.
    fn verdict(progs: &[&[u8]], data: &[u8; 64]) -> u32 {
        progs
            .iter()
            .map(|p| run(p, data))
            .min_by_key(|r| (r & 0xffff_0000) as i32)
            .unwrap()
    }

    fn call(nr: i64, arg0: u64) -> [u8; 64] {
        let mut d = [0u8; 64];
        d[0..4].copy_from_slice(&(nr as u32).to_ne_bytes());
        let arch: u32 = if cfg!(target_arch = "x86_64") {
            0xc000_003e
        } else {
            0xc000_00b7 // AUDIT_ARCH_AARCH64
        };
        d[4..8].copy_from_slice(&arch.to_ne_bytes());
        // args[0] at offset 16, as two dwords.
        d[16..24].copy_from_slice(&arg0.to_ne_bytes());
        d
    }

    #[test]
    fn a_forks_two_part_filter_decides_every_call_as_the_kernels_does() {
        for rlimit in [false, true] {
            let kernel = programs(rlimit).unwrap();
            let fork = fork_programs(rlimit).unwrap();
            let k: Vec<&[u8]> = kernel.programs.iter().map(Vec::as_slice).collect();
            let mut f: Vec<&[u8]> = fork.before.programs.iter().map(Vec::as_slice).collect();
            let before = f.clone();
            f.push(&fork.sealed);
            let mut args: Vec<u64> = PERSONAS.to_vec();
            args.extend(NAMESPACE_FLAGS.iter().map(|&f| f as u32 as u64));
            args.extend([0x11, 0x1234_5678]);
            for nr in (0..=600).chain((0..=600).map(|n| n | 0x4000_0000)) {
                for &arg in &args {
                    let d = call(nr, arg);
                    assert_eq!(verdict(&f, &d), verdict(&k, &d), "call {nr} ({arg:#x})");
                }
            }
            // Before it is sealed, only the mount moves pass that the
            // kernel's filter refuses.
            for (_, nr) in SEAL_CALLS {
                let d = call(*nr, 0);
                assert_eq!(verdict(&before, &d), 0x7fff_0000, "{nr} before");
                assert_eq!(verdict(&k, &d), 0x0005_0000 | libc::EPERM as u32);
            }
        }
    }

    #[test]
    fn the_x32_program_ends_in_allow() {
        let p = x32_denied();
        assert_eq!(p.len(), 7 * 8);
        assert_eq!(&p[p.len() - 4..], &0x7fff_0000u32.to_ne_bytes());
    }
}
