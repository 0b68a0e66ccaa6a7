/* decode - generate tokens over a paged KV cache, for every sequence of a
 * batch together: from a KVP stream that prefill wrote (stdin or FILE), or
 * from prompts it prefills itself.  The program is lib/engine/decodemain.c,
 * which specdec shares. */
#include "decodemain.h"

int main(int argc, char **argv) { return kvp_decode_main(argc, argv, 0); }
