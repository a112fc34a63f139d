//! # kiln-kernels
//!
//! CPU compute kernels that more than one model crate runs, kept below them so that none holds a
//! copy: [`sgemm`], the packed-panel f32 products of kiln-vision's projections and of
//! kiln-forcefield's host potential.
//!
//! ```
//! use kiln_kernels::sgemm;
//!
//! if sgemm::supported() {
//!     // W [3, 2] packed once, then y = x W + b for x [2, 3].
//!     let w = [1.0, 0.0, 0.0, 1.0, 1.0, -1.0];
//!     let packed = sgemm::Packed::new(3, &[(&w, 2)]);
//!     let x = [1.0, 2.0, 3.0, 0.5, 0.5, 0.5];
//!     let mut y = [0.0; 4];
//!     sgemm::product_on_this_thread(&mut y, &x, &packed, 2, &[0.5, 0.5]);
//!     assert_eq!(y, [4.5, -0.5, 1.5, 0.5]);
//! }
//! ```

pub mod sgemm;
