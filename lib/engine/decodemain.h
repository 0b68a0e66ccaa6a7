/* decodemain.h - the decode and specdec programs, which are one: specdec is
 * decode with a drafter (speculative decoding), and shares every option,
 * input, output and statistic of decode.
 *
 * Program layer (like runopts.h): parses the command line, prints, exits.
 */
#ifndef KVP_DECODEMAIN_H
#define KVP_DECODEMAIN_H

/* main() of decode (spec 0) or specdec (spec 1). */
int kvp_decode_main(int argc, char **argv, int spec);

#endif
