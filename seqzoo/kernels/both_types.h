/* Includes the kernel body named by BODY (a quoted file name) twice: with SCALAR float and SFX f32, then
 * with SCALAR double and SFX f64, so that one body gives both precisions' functions (name_f32, name_f64). */
#define SCALAR float
#define SFX f32
#include BODY
#undef SCALAR
#undef SFX

#define SCALAR double
#define SFX f64
#include BODY
#undef SCALAR
#undef SFX
#undef BODY
