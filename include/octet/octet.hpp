// octet/octet.hpp: everything that compiles with a plain C++ compiler.
// CUDA entry points are in the .cuh headers next to each .hpp.
#pragma once

#include "octet/config.hpp"
#include "octet/core/bits.hpp"
#include "octet/core/check.hpp"
#include "octet/core/executor.hpp"
#include "octet/core/matrix.hpp"
#include "octet/core/philox.hpp"
#include "octet/core/span.hpp"
#include "octet/format/convert.hpp"
#include "octet/format/encode.hpp"
#include "octet/format/float_format.hpp"
#include "octet/format/packed.hpp"
#include "octet/format/rounding.hpp"
#include "octet/monitor/memory_ledger.hpp"
#include "octet/quant/delayed.hpp"
#include "octet/quant/quantize.hpp"
#include "octet/quant/recipe.hpp"
#include "octet/quant/scale.hpp"
#include "octet/quant/stats.hpp"
#include "octet/quant/tensor.hpp"
