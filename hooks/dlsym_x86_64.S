/* dlsym's and dlvsym's entry points (see dlsym.c): ask shim_dlsym_pick, then either
 * return its answer or tail-jump to the real dlsym, so that the real one
 * sees the caller's return address (RTLD_NEXT, dlerror's caller). */
#if defined(__x86_64__) && defined(__linux__)
    .text
    .globl dlsym
    .type dlsym, @function
dlsym:
    .cfi_startproc
    push %rdi
    .cfi_adjust_cfa_offset 8
    push %rsi
    .cfi_adjust_cfa_offset 8
    sub $8, %rsp                 /* 16-byte alignment for the call */
    .cfi_adjust_cfa_offset 8
    mov 24(%rsp), %rdx           /* the caller's return address */
    call shim_dlsym_pick
    add $8, %rsp
    .cfi_adjust_cfa_offset -8
    pop %rsi
    .cfi_adjust_cfa_offset -8
    pop %rdi
    .cfi_adjust_cfa_offset -8
    test %rax, %rax
    jz 1f
    ret
1:
    jmp *shim_dlsym_next(%rip)
    .cfi_endproc
    .size dlsym, .-dlsym

/* dlvsym(handle, name, version): the same, with shim_dlvsym_pick. */
    .globl dlvsym
    .type dlvsym, @function
dlvsym:
    .cfi_startproc
    push %rdi
    .cfi_adjust_cfa_offset 8
    push %rsi
    .cfi_adjust_cfa_offset 8
    push %rdx                    /* three pushes: 16-byte alignment for the call */
    .cfi_adjust_cfa_offset 8
    mov 24(%rsp), %rcx           /* the caller's return address */
    call shim_dlvsym_pick
    pop %rdx
    .cfi_adjust_cfa_offset -8
    pop %rsi
    .cfi_adjust_cfa_offset -8
    pop %rdi
    .cfi_adjust_cfa_offset -8
    test %rax, %rax
    jz 1f
    ret
1:
    jmp *shim_dlvsym_next(%rip)
    .cfi_endproc
    .size dlvsym, .-dlvsym
#endif
    .section .note.GNU-stack, "", @progbits
