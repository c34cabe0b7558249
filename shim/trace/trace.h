/* Recording a trace of device memory (SPYRESHIM_TRACE): every allocation,
 * free, pressure event, collection and final out-of-memory, with stacks.
 * See trace.c and docs/trace-format.md. */
#ifndef SHIM_TRACE_H
#define SHIM_TRACE_H

/* From the constructor, after shim_leak_init (which turns stack capture on
 * for a trace): registers the hooks with the allocator, the pressure event
 * and the garbage collector. Nothing is opened until the first event. */
void shim_trace_init(void);
/* From the destructor, before the leak verdict (which may _exit). */
void shim_trace_at_exit(void);
/* fork() (shim/process/fork.c). */
void shim_trace_atfork_prepare(void);
void shim_trace_atfork_parent(void);
void shim_trace_atfork_child(void);

#endif
