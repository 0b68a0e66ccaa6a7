/* version.h - the library's version (also the programs' --version). */
#ifndef KVP_VERSION_H
#define KVP_VERSION_H

#define KVP_VERSION_MAJOR_LIB 0
#define KVP_VERSION_MINOR_LIB 1
#define KVP_VERSION_PATCH_LIB 0
#define KVP_VERSION "0.1.0"

#endif
