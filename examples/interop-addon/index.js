// Loads the example addon built by `npx cmake-js compile` (build/Release), or from where
// RANKFLOW_INTEROP_ADDON says (the GPU test builds it under the package's build/ folder).
const path = require('node:path');
module.exports = require(process.env.RANKFLOW_INTEROP_ADDON ?? path.join(__dirname, 'build', 'Release', 'rankflow_interop_example.node'));
