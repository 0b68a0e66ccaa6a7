/* specdec - decode with speculative decoding: a drafter guesses the next
 * tokens and the model checks them in one step; the output is what decode
 * gives, token for token.  The program is lib/engine/decodemain.c, shared
 * with decode. */
#include "decodemain.h"

int main(int argc, char **argv) { return kvp_decode_main(argc, argv, 1); }
